"""Fairness across device tiers: RF²'s MDAC (Maeng et al., RecSys '22,
Sec. 3.3, Eq. 1).

An optimisation p (excluding low-end devices, quantising their updates,
...) changes each tier's accuracy; the relative change of tier t is

  Delta_t = (beta_p^t - beta_0^t) / beta_0^t,

with beta the tier's accuracy (AUC in RF²) under p and without any
optimisation (p = 0: the paired baseline, same data, mapping and seed). The
Maximum Difference in Accuracy Change is

  MDAC = max over tiers t_i, t_j of |Delta_{t_i} - Delta_{t_j}|
       = max_t Delta_t - min_t Delta_t,

0 when every tier gains or loses alike; reported in percent. Computed from
unrounded accuracies (the reference code prints AUCs rounded to 4 places).
"""

from collections.abc import Mapping


def relative_changes(baseline: Mapping[str, float],
                     optimized: Mapping[str, float]) -> dict[str, float]:
  """{tier: Delta_t} for tiers with an accuracy in both runs.

  Args:
    baseline: {tier name: accuracy} of the run without optimisation.
    optimized: {tier name: accuracy} of the optimised run, the same tiers.
  """
  if set(baseline) != set(optimized):
    raise ValueError(
        f'The runs report other tiers: baseline {sorted(baseline)}, '
        f'optimised {sorted(optimized)}; pair runs of the same mapping.')
  changes = {}
  for tier, before in baseline.items():
    if not before > 0:
      raise ValueError(
          f'Tier {tier!r} has a baseline accuracy of {before}: a relative '
          'change needs one above 0.')
    changes[tier] = (optimized[tier] - before) / before
  return changes


def mdac(baseline: Mapping[str, float],
         optimized: Mapping[str, float]) -> float:
  """MDAC (Eq. 1) as a fraction (x 100 for percent) over the tiers both
  runs report; at least two."""
  changes = relative_changes(baseline, optimized)
  if len(changes) < 2:
    raise ValueError(
        f'MDAC compares tiers: got {len(changes)} ({sorted(changes)}).')
  return max(changes.values()) - min(changes.values())
