"""Flags of the device tiers' optimisation (group `tier_optimization`,
taken by every run; RF², Maeng et al., RecSys '22, Sec. 5.2) and of the
paired baseline its fairness is measured against.

A selection (exclude_low, overselect) goes to the run's protocol
(`tasks.client_selection`), so every method takes it; an encoding of the
uploads (prune, quant, quants) or Channel goes to the method's builder as
`tier_optimization`, and a method whose builder does not take it refuses
it here. With --paired_baseline the summary holds the MDAC (Eq. 1) of the
protocol's per-tier metric against that run (`programs/paired_runs`).

Example:
  --method=pfedrec --device_tiers=dirichlet:0.005 \\
      --tier_optimization=quant:4,8,32 --paired_baseline=runs/none_seed0
"""

from absl import flags

from tff_fedrec import tier_optimizations
from tff_fedrec.algorithms import registry
from tff_fedrec.programs.flag_groups import group

TIER_OPTIMIZATION = flags.DEFINE_string(
    'tier_optimization', 'none',
    'What each device tier (low,mid,high; tier 0,1,2) does (RF² Sec. 5.2): '
    'none; exclude_low (tier 0 never trains); overselect:0.2 (draw 20% '
    'more clients, drop the extra slowest tier first); prune:0.75,0.5,0 '
    '(share of each upload dropped); quant:8,16,32 (bits; 32 untouched); '
    'quants:8,16,32 (QuantS, sign apart); channel:0.25,0.5,1 (share of '
    'hidden units kept; rf2 only). Selections work for every method, '
    'encodings for those whose uploads take them. The paper\'s 14: '
    + ' '.join(tier_optimizations.PAPER_CONFIGURATIONS) + '.',
)
PAIRED_BASELINE = flags.DEFINE_string(
    'paired_baseline', None,
    'The --root_dir of a finished run with --tier_optimization=none and '
    'otherwise these flags; summary.json then holds the MDAC (RF² Eq. 1) '
    'of the protocol\'s per-tier metric against it.',
)


def optimization() -> tier_optimizations.TierOptimization:
  """--tier_optimization, parsed (FlagError naming what is wrong)."""
  try:
    return tier_optimizations.parse(TIER_OPTIMIZATION.value)
  except ValueError as error:
    raise group.FlagError(f'--tier_optimization: {error}') from None


def _check(entry) -> None:
  parsed = optimization()
  if parsed.changes_the_method and not entry.takes('tier_optimization'):
    raise group.FlagError(
        f'--tier_optimization={TIER_OPTIMIZATION.value}: {entry.name} does '
        'not encode its uploads by device tier. Methods that do: '
        + ', '.join(_takers()) + '; every method takes exclude_low and '
        'overselect.')


def _takers() -> list[str]:
  return [name for name, entry in registry.METHODS.items()
          if entry.takes('tier_optimization')]


def _arguments(context: group.BuildContext) -> dict:
  if not context.entry.takes('tier_optimization'):
    return {}
  return {'tier_optimization': TIER_OPTIMIZATION.value}


GROUPS = (
    group.FlagGroup(
        'tier_optimization', 'the device tiers\' optimisation',
        (TIER_OPTIMIZATION, PAIRED_BASELINE), _arguments, _check,
    ),
)
