"""Client tiers by data size (HeteFedRec, Yuan et al., ICDE 2024).

HeteFedRec Sec. IV.A puts each client into one of three groups, small U_s,
medium U_m and large U_l, by its number of user-item interactions, and gives
each group a model of its own width (N_s < N_m < N_l). Sec. V.D divides the
users 5:3:2, and Table VI compares 1:1:1, 2:3:5, "All Small" (10:0:0) and
"All Large" (0:0:10).

A tier assignment is plain data, int32 [U] with 0 = small, 1 = medium,
2 = large (the indices of `TIER_NAMES`), so the methods that consume it do
not care which policy produced it.
"""

from collections.abc import Sequence

import numpy as np

TIER_NAMES = ('small', 'medium', 'large')


def _check_ratio(ratio: Sequence[float]) -> np.ndarray:
  ratio = np.asarray(ratio, dtype=np.float64)
  if ratio.shape != (len(TIER_NAMES),):
    raise ValueError(
        f'ratio must hold {len(TIER_NAMES)} numbers (small, medium, large); '
        f'got shape {ratio.shape}.'
    )
  if not np.all(np.isfinite(ratio)) or np.any(ratio < 0):
    raise ValueError(f'ratio must be finite and non-negative; got {ratio}.')
  if ratio.sum() <= 0:
    raise ValueError(f'ratio must have a positive sum; got {ratio}.')
  return ratio


def assign_tiers_by_interactions(
    num_interactions: Sequence[int], ratio: Sequence[float] = (5, 3, 2)
) -> np.ndarray:
  """Tiers by number of interactions, HeteFedRec Sec. IV.A and Table VI.

  Users are sorted by number of (training) interactions, fewest first; ties
  keep user order (a stable sort), so the result is deterministic. With
  boundaries b = round(cumsum(ratio) / sum(ratio) * U), sorted positions
  [0, b_0) are small, [b_0, b_1) medium and [b_1, U) large. Halves round to
  even, as Python's `round` does.

  The assignment returned is data, an int array, so another policy (e.g.
  RF²'s device classes) can supply its own in the same form.

  Example: counts [9, 1, 5, 7] with ratio (2, 1, 1) give boundaries [2, 3, 4];
  sorted by count the users are 1, 2, 3, 0, so the tiers are [2, 0, 0, 1].

  Args:
    num_interactions: int [U], each user's number of training interactions.
    ratio: three non-negative numbers with a positive sum, the proportions of
      small, medium and large users; zeros leave a tier empty, e.g. (1, 0, 0)
      puts every user in the small tier ("All Small").

  Returns:
    int32 [U], each user's tier: 0 small, 1 medium, 2 large.

  Raises:
    ValueError: if num_interactions is not 1-D or ratio is not three finite
      non-negative numbers with a positive sum.
  """
  counts = np.asarray(num_interactions)
  if counts.ndim != 1:
    raise ValueError(
        f'num_interactions must be 1-D [U]; got shape {counts.shape}.'
    )
  ratio = _check_ratio(ratio)
  num_users = counts.shape[0]
  cumulative = np.cumsum(ratio)
  # Dividing by the last cumulative sum (rather than ratio.sum()) makes the
  # last boundary exactly U, so every user falls into some tier.
  boundaries = np.round(cumulative / cumulative[-1] * num_users)
  tier_of_position = np.searchsorted(
      boundaries, np.arange(num_users), side='right'
  )
  tiers = np.empty(num_users, np.int32)
  tiers[np.argsort(counts, kind='stable')] = tier_of_position
  return tiers


def tier_sizes(tiers: Sequence[int]) -> np.ndarray:
  """The number of users in each tier.

  Args:
    tiers: int [U] with values in {0, 1, 2}, as from
      `assign_tiers_by_interactions`.

  Returns:
    int64 [3], the counts of small, medium and large users.

  Raises:
    ValueError: if tiers is not 1-D or holds a value outside {0, 1, 2}.
  """
  tiers = np.asarray(tiers)
  if tiers.ndim != 1:
    raise ValueError(f'tiers must be 1-D [U]; got shape {tiers.shape}.')
  if tiers.size and (tiers.min() < 0 or tiers.max() >= len(TIER_NAMES)):
    raise ValueError(
        f'tiers must lie in 0..{len(TIER_NAMES) - 1}; got values from '
        f'{tiers.min()} to {tiers.max()}.'
    )
  return np.bincount(
      tiers.astype(np.int64), minlength=len(TIER_NAMES)
  ).astype(np.int64)


class ByInteractions:
  """The tier policy of HeteFedRec: `assign_tiers_by_interactions` in
  `ratio` (small:medium:large).

  A tier policy has `tier_names` (what tiers 0, 1, 2 are called in a run's
  results), `description` and `assign(train_offsets, train_items, seed) ->
  int32 [U]` from the users' training items in CSR form; the program asks
  one once per run and hands the result to the method and the protocol, so
  every part of a run sees the same tiers. RF²'s device tiers
  (`device_tiers.RoundRobin`, `device_tiers.Dirichlet`) are the others.
  """

  tier_names = TIER_NAMES

  def __init__(self, ratio: Sequence[float] = (5, 3, 2)):
    self.ratio = tuple(float(r) for r in _check_ratio(ratio))

  @property
  def description(self) -> str:
    return 'by interactions ' + ':'.join(f'{r:g}' for r in self.ratio)

  def assign(self, train_offsets: Sequence[int], train_items=None,
             seed: int = 0, clicks=None):
    del train_items, clicks  # Only their number counts.
    del seed  # Deterministic: sorted by count, ties in user order.
    return assign_tiers_by_interactions(np.diff(train_offsets), self.ratio)
