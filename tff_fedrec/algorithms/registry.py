"""The one method registry: `--method` name -> entry.

An entry says how to build the method (its builder, imported when first
used, so the registry itself is read without TensorFlow), which protocol
it is evaluated under (`tasks.protocol`), and which groups of flags it
takes (`programs/flag_groups`). Every builder takes the keyword arguments

  data: `method.RunData`, seed: int

and those its flag groups give (see each builder). Adding a method is its
module or package, one entry here and, if it has flags of its own, one
flag group. A method of the caller's own joins with `register`.

Example:
  >>> entry = get('pfedrec')
  >>> entry.protocol, entry.flag_groups[:2]
  ('leave_one_out', ('training', 'local_sgd'))
  >>> method = entry.build(data=run_data, seed=0)
"""

import dataclasses
import importlib
import inspect
from typing import Optional

LEAVE_ONE_OUT = 'leave_one_out'
RANDOM_SPLIT = 'random_split'
CLICK_THROUGH = 'click_through'

# Groups of the local-SGD methods of PFedRec's paper, FedRAS's, and the
# tiered ones of HeteFedRec's; `user_embedding` for those with one. Every
# method takes the run's common groups too (the users' tiers among them).
_LOCAL_SGD = ('training', 'local_sgd', 'embedding')
_TIERED = ('training', 'user_embedding', 'tier_models', 'score_layers',
           'base_model')
# Any exchange.
_EXCHANGE = ('exchange',)


@dataclasses.dataclass(frozen=True)
class MethodEntry:
  """One method (module docstring).

  Attributes:
    name: Its `--method` name.
    builder: 'module:function' of its builder.
    protocol: LEAVE_ONE_OUT, RANDOM_SPLIT or CLICK_THROUGH.
    flag_groups: The groups of flags it takes.
    paper: Where it comes from.
    arguments: Builder arguments fixed by the entry (an ablation).
    exchange: The exchange the method fixes (`exchanges`, `fedras`:
      'fedras', 'top_k', 'svd', 'colr', 'small_dim'), or None if
      `--exchange` chooses it.
  """

  name: str
  builder: str
  protocol: str
  flag_groups: tuple[str, ...]
  paper: str
  arguments: tuple[tuple[str, object], ...] = ()
  exchange: Optional[str] = None

  def _function(self):
    module, function = self.builder.split(':')
    return getattr(importlib.import_module(module), function)

  def build(self, **kwargs):
    """The built method: `builder(**arguments, **kwargs)`."""
    return self._function()(**dict(self.arguments), **kwargs)

  def default(self, argument: str):
    """The builder's default value of `argument`."""
    return inspect.signature(self._function()).parameters[argument].default

  def takes(self, argument: str) -> bool:
    return argument in inspect.signature(self._function()).parameters


_ALGORITHMS = 'tff_fedrec.algorithms'
_PFEDREC = 'PFedRec (Zhang et al., IJCAI 2023)'
_FEDRAS = 'FedRAS (Lu et al., KDD 2025)'
_HETEFEDREC = 'HeteFedRec (Yuan et al., ICDE 2024)'
_APFR_GKD = 'APFR-GKD (Zhao et al.)'


def _tiered(name, function, **options):
  return MethodEntry(
      name, f'{_ALGORITHMS}.hetefedrec.tiered_method:{function}',
      RANDOM_SPLIT, options.pop('flag_groups', _TIERED + ('hetefedrec',)),
      _HETEFEDREC, **options,
  )


def _fedras(name, function, exchange, **options):
  return MethodEntry(
      name, f'{_ALGORITHMS}.fedras.methods:{function}', LEAVE_ONE_OUT,
      _LOCAL_SGD + ('user_embedding', 'score_layers', 'base_model',
                    'exchange'),
      _FEDRAS, exchange=exchange, **options,
  )


def _apfr_gkd(name, ablation=None):
  return MethodEntry(
      name, f'{_ALGORITHMS}.apfr_gkd.method:build_apfr_gkd', LEAVE_ONE_OUT,
      _LOCAL_SGD + ('user_embedding', 'score_layers', 'apfr_gkd'),
      _APFR_GKD + (f', ablation {ablation}' if ablation else ''),
      arguments=(('ablation', ablation),) if ablation else (),
  )


_ENTRIES = (
    MethodEntry('pfedrec', f'{_ALGORITHMS}.pfedrec:build_pfedrec',
                LEAVE_ONE_OUT, _LOCAL_SGD + ('score_layers', *_EXCHANGE),
                _PFEDREC),
    MethodEntry('fedmf', f'{_ALGORITHMS}.fedmf:build_fedmf', LEAVE_ONE_OUT,
                _LOCAL_SGD + ('user_embedding', *_EXCHANGE),
                f'{_PFEDREC}, baseline'),
    MethodEntry('fedncf', f'{_ALGORITHMS}.fedncf:build_fedncf',
                LEAVE_ONE_OUT,
                _LOCAL_SGD + ('user_embedding', 'score_layers', *_EXCHANGE),
                f'{_PFEDREC}, baseline'),
    MethodEntry('fedrecon', f'{_ALGORITHMS}.fedrecon.method:build_fedrecon',
                LEAVE_ONE_OUT, _LOCAL_SGD, f'{_PFEDREC}, baseline'),
    _fedras('fedras', 'build_fedras', 'fedras'),
    _fedras('fedras_e', 'build_fedras', 'fedras',
            arguments=(('ablation', 'E'),)),
    _fedras('fedras_f', 'build_fedras', 'fedras',
            arguments=(('ablation', 'F'),)),
    _fedras('fedras_t', 'build_fedras', 'fedras',
            arguments=(('ablation', 'T'),)),
    _fedras('topk', 'build_codec_baseline', 'top_k',
            arguments=(('scheme', 'top_k'),)),
    _fedras('svd', 'build_codec_baseline', 'svd',
            arguments=(('scheme', 'svd'),)),
    _fedras('colr', 'build_codec_baseline', 'colr',
            arguments=(('scheme', 'colr'),)),
    _fedras('base_small_dim', 'build_base_small_dim', 'small_dim'),
    _tiered('hetefedrec', 'build_hetefedrec'),
    _tiered('direct_aggregate', 'build_direct_aggregate'),
    _tiered('clustered', 'build_clustered'),
    _tiered('all_small', 'build_all_small'),
    _tiered('all_large', 'build_all_large'),
    _tiered('all_large_exclusive', 'build_all_large_exclusive'),
    _tiered('standalone', 'build_standalone', flag_groups=_TIERED),
    _apfr_gkd('apfr_gkd'),
    _apfr_gkd('apfr_gkd_unary', 'unary'),
    _apfr_gkd('apfr_gkd_dual', 'dual'),
    _apfr_gkd('apfr_gkd_no_buffer', 'no_buffer'),
    _apfr_gkd('apfr_gkd_no_kd', 'no_kd'),
    MethodEntry('fedrap', f'{_ALGORITHMS}.fedrap.method:build_fedrap',
                LEAVE_ONE_OUT, ('training', 'embedding', 'fedrap'),
                'FedRAP (Li et al., ICLR 2024), APFR-GKD baseline'),
    MethodEntry('rf2', f'{_ALGORITHMS}.rf2.method:build_rf2', CLICK_THROUGH,
                ('base_model', 'rf2'),
                'RF² (Maeng et al., RecSys 2022)'),
)

METHODS = {entry.name: entry for entry in _ENTRIES}


def register(entry: MethodEntry) -> None:
  """Adds a method the registry does not ship (a package of the caller's,
  a test's), which the training program then trains like any other:
  `--method=<entry.name>` once the registering module is imported.

  Raises:
    ValueError: for a name already registered.
  """
  if entry.name in METHODS:
    raise ValueError(f'A method named {entry.name!r} is already registered.')
  METHODS[entry.name] = entry


def get(name: str) -> MethodEntry:
  """The entry registered as `name`; ValueError naming the known methods."""
  try:
    return METHODS[name]
  except KeyError:
    raise ValueError(
        f'Unknown method {name!r}. Known methods: {", ".join(METHODS)}.'
    ) from None


def base_method(name: str) -> Optional[str]:
  """The method whose variant `name` is (an entry fixing arguments of the
  same builder, e.g. an ablation: 'apfr_gkd_no_kd' -> 'apfr_gkd'), or None
  for a method that is nobody's variant."""
  entry = get(name)
  if not entry.arguments:
    return None
  for other in METHODS.values():
    if other.builder == entry.builder and not other.arguments:
      return other.name
  return None


def methods_taking(group: str) -> list[str]:
  """The names of the methods that take flag group `group` (one of their
  entries' groups, or their protocol's)."""
  return [e.name for e in METHODS.values()
          if group in e.flag_groups or group == e.protocol]
