"""A flag that is not given never replaces a method's own default.

For every registry entry, the flags of its groups are parsed as the
training program parses them with nothing but --method given, and the
builder arguments they make (`training_program.builder_arguments`) are
compared with the builder's own defaults: each argument equal to the
builder's default, each field of the training configuration equal to the
default configuration's. APFR-GKD's one-hidden-layer score MLP (32) and its
item learning rate (a tenth of PFedRec's rule) are such defaults, which an
unset --hidden_units (as ()) and an unset --item_lr_eta (as 80) used to
replace.
"""

import dataclasses
import importlib
import inspect

from absl import flags
import numpy as np
import pytest

from tff_fedrec.algorithms import method as method_lib
from tff_fedrec.algorithms import registry
from tff_fedrec.programs import training_program

_RUN_DATA = method_lib.RunData(
    num_users=4, num_items=50, train_offsets=np.array([0, 2, 4, 6, 8]),
    train_items=np.arange(8),
)


def _arguments(method, *args):
  """The builder arguments of `train --method=method *args`."""
  try:
    flags.FLAGS(['train', f'--method={method}', '--root_dir=unused', *args])
    entry = registry.get(method)
    return training_program.builder_arguments(entry, _RUN_DATA)
  finally:
    flags.FLAGS.unparse_flags()


def _forwarded_default(entry, name):
  """The default of an argument a builder forwards through **options to
  its module's `model_spec` (the tiered methods' widths, hidden_units,
  model, neighbor_gradient)."""
  module = importlib.import_module(entry.builder.split(':')[0])
  return inspect.signature(module.model_spec).parameters[name].default


def _builder_default(entry, name, value):
  """The builder's default of argument `name`; where that is None (the
  builder makes the options itself), the options `value`'s type makes
  from its required fields alone."""
  default = (entry.default(name) if entry.takes(name)
             else _forwarded_default(entry, name))
  if default is None and dataclasses.is_dataclass(value):
    required = {
        field.name: getattr(value, field.name)
        for field in dataclasses.fields(value)
        if field.default is dataclasses.MISSING
        and field.default_factory is dataclasses.MISSING
    }
    return type(value)(**required)
  return default


def _differences(entry, arguments):
  """'argument: given vs default' for every argument (and training field)
  the unset flags would change."""
  differences = []
  for name, value in arguments.items():
    default = _builder_default(entry, name, value)
    if default is inspect.Parameter.empty:
      continue
    if name == 'training':
      for field in dataclasses.fields(default):
        given, own = getattr(value, field.name), getattr(default, field.name)
        if given != own:
          differences.append(f'training.{field.name}: {given!r} vs {own!r}')
    elif value != default:
      differences.append(f'{name}: {value!r} vs {default!r}')
  return differences


@pytest.mark.parametrize('method', list(registry.METHODS))
def test_unset_flags_keep_every_builder_default(method):
  entry = registry.get(method)
  assert _differences(entry, _arguments(method)) == []


def test_apfr_gkd_without_flags_keeps_its_mlp_and_item_learning_rate():
  arguments = _arguments('apfr_gkd')
  assert 'hidden_units' not in arguments
  assert registry.get('apfr_gkd').default('hidden_units') == (32,)
  training = arguments['training'].for_items(1682)
  # 0.1 x 1682 x 8: a tenth of PFedRec's rule, which diverges with ten
  # local epochs.
  assert training.item_learning_rate == pytest.approx(1345.6)
  assert training.local_epochs == 10
  assert 'client_start' not in arguments
  assert registry.get('apfr_gkd').default('client_start') == 'download'


@pytest.mark.parametrize('args, field, expected', [
    (['--hidden_units=16,8'], 'hidden_units', (16, 8)),
    (['--hidden_units='], 'hidden_units', ()),
    (['--embedding_dim=8'], 'embedding_dim', 8),
    (['--buffer_size=2'], 'buffer_size', 2),
    (['--client_start=download', '--student_start=latest_aggregate'],
     'student_start', 'latest_aggregate'),
    (['--client_start=own_model'], 'client_start', 'own_model'),
], ids=lambda value: str(value))
def test_given_flags_reach_the_builder(args, field, expected):
  assert _arguments('apfr_gkd', *args)[field] == expected


@pytest.mark.parametrize('method, args, field, expected', [
    ('apfr_gkd', ['--user_learning_rate=2'], 'user_learning_rate', 2.0),
    ('fedncf', ['--user_learning_rate=2'], 'user_learning_rate', 2.0),
    ('hetefedrec', ['--user_learning_rate=0.01'], 'user_learning_rate', 0.01),
    ('pfedrec', ['--item_lr_eta=8'], 'item_lr_eta', 8.0),
    ('pfedrec', ['--local_epochs=3'], 'local_epochs', 3),
    ('fedrap', ['--local_epochs=3'], 'local_epochs', 3),
], ids=lambda value: str(value))
def test_given_training_flags_reach_the_configuration(method, args, field,
                                                      expected):
  assert getattr(_arguments(method, *args)['training'], field) == expected


def test_help_shows_every_group_once_the_common_ones_first():
  text = training_program.help_text()
  positions = {
      name: text.index(f'[{name}; ') for name in training_program.GROUPS}
  assert all(text.count(f'[{name}; ') == 1 for name in positions)
  common = [positions[name] for name in training_program.COMMON_GROUPS]
  assert max(common) < min(
      position for name, position in positions.items()
      if name not in training_program.COMMON_GROUPS)
