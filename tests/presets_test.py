"""Every preset flag file names real flags of `train` with valid values,
and the methods and data sets it names exist."""

import glob
import os

from absl import flags
import pytest

from tff_fedrec.algorithms import registry
from tff_fedrec.programs import training_program  # Defines train's flags.

_PRESETS = sorted(
    glob.glob(
        os.path.join(
            os.path.dirname(training_program.__file__), 'presets', '*.flags'
        )
    )
)


def _arguments(path):
  return flags.FLAGS.read_flags_from_files([f'--flagfile={path}'])


def test_presets_exist():
  assert len(_PRESETS) >= 20


@pytest.mark.parametrize('path', _PRESETS, ids=os.path.basename)
def test_preset_flags_parse(path):
  values = {}
  for argument in _arguments(path):
    name, _, value = argument[2:].partition('=')
    if name.startswith('no') and name[2:] in flags.FLAGS and not value:
      name, value = name[2:], 'false'
    assert name in flags.FLAGS, f'{path}: unknown flag --{name}'
    values[name] = flags.FLAGS[name].parser.parse(value or 'true')
  assert values['method'] in registry.METHODS
  method, dataset = os.path.basename(path)[: -len('.flags')].rsplit('_', 1)
  assert values['method'] == method
  assert values['dataset'].replace('-', '') == dataset


@pytest.mark.parametrize('path', _PRESETS, ids=os.path.basename)
def test_preset_flags_are_all_taken_by_its_method(path):
  """The program refuses a flag of a group the method does not take, so a
  preset may name only flags of the method's groups."""
  entry = registry.get(os.path.basename(path).rsplit('_', 1)[0])
  taken = {*training_program.COMMON_GROUPS, entry.protocol,
           *entry.flag_groups}
  group_of = {
      holder.name: name
      for name, group in training_program.GROUPS.items()
      for holder in group.holders
  }
  for argument in _arguments(path):
    name = argument[2:].partition('=')[0]
    if name not in group_of and name.startswith('no'):
      name = name[2:]
    assert group_of[name] in taken, f'{path}: --{name} is refused'
