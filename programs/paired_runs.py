"""A run paired with its baseline: the same run without its tier
optimisation, and the MDAC between them (RF², Maeng et al., RecSys '22,
Eq. 1), for every method and protocol.

A baseline pairs with a run when it is finished (its summary.json) and
was started with the same flags but for the optimisation (its
--tier_optimization none) and the flags that change no result
(`NOT_COMPARED`: where the run is written, how it is executed and
checkpointed): the same users, tiers, initial model and client order, so
a per-tier change is the optimisation's.

Example:
  >>> check_baseline('runs/none_seed0', current_flags)   # FlagError if not
  >>> mdac_fields(summary['test']['per_tier'], 'runs/none_seed0', 'hr@10')
  {'mdac': 0.012, 'relative_change': {...}, 'metric': 'hr@10', ...}
"""

import json
import os

from tff_fedrec import fairness
from tff_fedrec.programs import run_directory
from tff_fedrec.programs.flag_groups import group

# Flags a pair may differ in: the optimisation and the baseline
# themselves, the run's folder, execution, checkpoints and grouping of
# users per TFF client (a round's result does not depend on it).
NOT_COMPARED = frozenset({
    'tier_optimization', 'paired_baseline', 'root_dir', 'checkpoint_every',
    'users_per_tff_client', 'cohort_size', 'cohort_state_mb',
    'client_store', 'max_worker_restarts', 'executor', 'workers', 'worker_timeout_seconds',
    'allow_insecure_remote',
})


def _summary(baseline: str) -> dict:
  path = os.path.join(baseline, 'summary.json')
  try:
    with open(path) as file:
      return json.load(file)
  except (OSError, ValueError) as error:
    raise group.FlagError(
        f'--paired_baseline={baseline} holds no summary.json of a finished '
        f'run ({error}): give the --root_dir of a finished run '
        'with --tier_optimization=none and otherwise this run\'s flags.'
    ) from None


def check_baseline(baseline: str, current_flags: dict) -> None:
  """FlagError unless the run in `baseline` is this run's baseline
  (module docstring); `current_flags` {name: value} as run.flags writes
  them."""
  _summary(baseline)
  saved = run_directory.saved_flags(baseline, current_flags)
  if saved is None:
    raise group.FlagError(
        f'--paired_baseline={baseline} has no run.flags: give the '
        '--root_dir of a run of this program.')
  if saved.get('tier_optimization', 'none') != 'none':
    raise group.FlagError(
        f'--paired_baseline={baseline} ran --tier_optimization='
        f'{saved["tier_optimization"]}; the baseline is the run with '
        '--tier_optimization=none.')
  differing = sorted(
      name for name in set(saved) | set(current_flags)
      if name not in NOT_COMPARED
      and saved.get(name) != current_flags.get(name))
  if differing:
    shown = ', '.join(
        f'--{name} ({saved.get(name)!r} there, {current_flags.get(name)!r} '
        'here)' for name in differing[:4])
    raise group.FlagError(
        f'--paired_baseline={baseline} is not this run\'s baseline: its '
        f'flags differ in {shown}. Pair runs that differ only in '
        '--tier_optimization (the baseline with none).')


def mdac_fields(per_tier: dict, baseline: str, metric: str) -> dict:
  """The summary's `mdac` field: MDAC (RF² Eq. 1) and each tier's relative
  change of `metric` of this run's per-tier test figures `per_tier`
  against the baseline's (its summary.json's test.per_tier; unrounded)."""
  try:
    base_tiers = _summary(baseline)['test']['per_tier']
    base = {name: tier[metric] for name, tier in base_tiers.items()}
  except (KeyError, TypeError):
    raise ValueError(
        f'The paired baseline {baseline} has no per-tier test {metric} in '
        'its summary.json: give the --root_dir of a finished run of the '
        'same protocol.') from None
  optimized = {name: tier[metric] for name, tier in per_tier.items()}
  return {'mdac': fairness.mdac(base, optimized),
          'relative_change': fairness.relative_changes(base, optimized),
          'metric': metric, 'baseline': baseline}


def mdac_row(summary: dict) -> list[tuple[str, str]]:
  """The results row of the summary's `mdac` field, if it has one."""
  if 'mdac' not in summary:
    return []
  mdac = summary['mdac']
  return [('MDAC vs the paired baseline',
           f'{100 * mdac["mdac"]:.3f}% (relative {mdac["metric"]} change '
           + ', '.join(f'{k} {100 * v:+.3f}%'
                       for k, v in mdac['relative_change'].items()) + ')')]
