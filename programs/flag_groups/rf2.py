"""Flags of RF² (group `rf2`, Maeng et al., RecSys '22): the tier-aware
optimisation, the server's learning rate and the paired baseline MDAC is
measured against. Its model is --model=dlrm|din (group `base_model`), its
tiers --device_tiers (group `tiers`), its protocol click_through.

Example:
  --method=rf2 --model=dlrm --device_tiers=dirichlet:0.05 \\
      --tier_optimization=quants:4,8,32 --paired_baseline=runs/none_seed0
"""

import json
import os

from absl import flags

from tff_fedrec.algorithms.rf2 import tier_optimizations
from tff_fedrec.programs import run_directory
from tff_fedrec.programs.flag_groups import group
from tff_fedrec.programs.flag_groups import run as run_flags
from tff_fedrec.programs.flag_groups import tiers as tiers_flags

TIER_OPTIMIZATION = flags.DEFINE_string(
    'tier_optimization', 'none',
    'RF²: what each device tier (low,mid,high) does: none; exclude_low; '
    'overselect:0.2; prune:0.75,0.5,0 (share of each update dropped); '
    'quant:8,16,32 (bits; 32 untouched); quants:8,16,32 (QuantS, sign '
    'apart); channel:0.25,0.5,1 (share of hidden units kept). The paper\'s '
    '14: ' + ' '.join(tier_optimizations.PAPER_CONFIGURATIONS) + '.',
)
SERVER_LEARNING_RATE = flags.DEFINE_float(
    'server_learning_rate', None,
    'RF²: the server\'s Adagrad learning rate (default 0.1, the paper\'s on '
    'MovieLens).',
)
PAIRED_BASELINE = flags.DEFINE_string(
    'paired_baseline', None,
    'RF²: the --root_dir of a finished run without optimisation (same '
    '--seed and --device_tiers); summary.json then holds the MDAC (Eq. 1) '
    'of this run against it.',
)


def optimization() -> tier_optimizations.TierOptimization:
  """--tier_optimization, parsed (FlagError naming what is wrong)."""
  try:
    return tier_optimizations.parse(TIER_OPTIMIZATION.value)
  except ValueError as error:
    raise group.FlagError(f'--tier_optimization: {error}') from None


def _check(entry) -> None:
  del entry
  optimization()
  group.require_finite(SERVER_LEARNING_RATE, positive=True)
  if PAIRED_BASELINE.value is not None:
    _check_paired_baseline(PAIRED_BASELINE.value)


def _check_paired_baseline(baseline: str) -> None:
  """FlagError unless `baseline` is a finished rf2 run without
  optimisation of this run's seed, tiers and model: MDAC compares the
  same users, tiers, initial model and client order."""
  path = os.path.join(baseline, 'summary.json')
  try:
    with open(path) as file:
      config = json.load(file)['config']
  except (OSError, ValueError, KeyError):
    raise group.FlagError(
        f'--paired_baseline={baseline} holds no summary.json of a finished '
        'run: give the --root_dir of a finished rf2 run with '
        '--tier_optimization=none.') from None
  # The seed as the run was given it (its run.flags).
  seed = (run_directory.saved_flags(baseline, ()) or {}).get('seed')
  config['seed'] = int(seed) if seed and seed.isdigit() else seed
  expected = {
      'tier_optimization': 'none', 'seed': run_flags.SEED.value,
      'tiers': tiers_flags.tier_policy().description,
      'model': flags.FLAGS['model'].value or 'dlrm',
  }
  for key, value in expected.items():
    if config.get(key) != value:
      raise group.FlagError(
          f'--paired_baseline={baseline} is not this run\'s baseline: its '
          f'{key} is {config.get(key)!r}, this run\'s {value!r}. Pair runs '
          'of the same --seed, --device_tiers and --model, the baseline '
          'with --tier_optimization=none.')


def _arguments(context: group.BuildContext) -> dict:
  del context
  arguments = {'tier_optimization': TIER_OPTIMIZATION.value}
  arguments.update(group.given_fields(
      (SERVER_LEARNING_RATE, 'server_learning_rate'),
      (PAIRED_BASELINE, 'paired_baseline')))
  return arguments


GROUPS = (
    group.FlagGroup(
        'rf2', 'RF²\'s tier-aware optimisation',
        (TIER_OPTIMIZATION, SERVER_LEARNING_RATE, PAIRED_BASELINE),
        _arguments, _check,
    ),
)
