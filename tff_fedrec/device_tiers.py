"""Device tiers of RF² (Maeng et al., "Towards Fair Federated Recommendation
Learning", RecSys '22): which users own low-, mid- and high-end devices.

RF² Sec. 3 calls a data distribution that differs across device tiers
*system-induced data heterogeneity*, and builds it with Algorithm 1: items
in descending popularity, each with tier shares (p_L, p_M, p_S) drawn from
Dirichlet(alpha, alpha, alpha) and sorted descending; the item's clickers
not yet mapped go mostly to the currently smallest tier, so users who click
the same items share a tier. A small alpha gives skewed shares and strongly
tier-correlated data (Sec. 5.3's levels: alpha 5000, 5, 0.5, 0.05, 0.005);
"Random", no correlation, is `round_robin`.

`dirichlet` follows the authors' code (facebookresearch/RF2,
`dlrm/data_utils.py: map_tiers`, as `../shared/specs/rf2.md` section 1
reads it) where it differs from the paper's text, and is seeded where it was
not:
- clicks are every positive event of the user, training and test ones,
  in the order given; an item's popularity is its number of click events;
- items are taken in descending (popularity, item id) order (ties: the
  larger id first); users without clicks form a "null item" of their own,
  taken by its size among the others;
- an item's not-yet-mapped clickers (each once, in user order) are
  shuffled, then split deterministically: the first int(p_L n) go to the
  currently smallest tier, up to int(p_L n + p_M n) to the middle one, the
  rest to the largest (tiers ordered by (size, index), so at the start the
  low tier takes the largest share of the most popular item's clickers),
  where the paper draws r ~ U(0, 1) per user;
- the Dirichlet draw is repeated while it holds a NaN (tiny alpha);
- the shares and the shuffles come from one `np.random.Generator` seeded
  by `seed` (the reference's `random.shuffle` was not seeded, so its
  mapping could not be reproduced).

Tiers are int32 [U] with 0 = low, 1 = mid, 2 = high (`TIER_NAMES`), the
same plain form as `tiers.assign_tiers_by_interactions`.
"""

from collections.abc import Sequence
import math

import numpy as np

TIER_NAMES = ('low', 'mid', 'high')
# Sec. 5.3's levels of system-induced heterogeneity.
HETEROGENEITY_LEVELS = {
    'vlow': 5000.0, 'low': 5.0, 'mid': 0.5, 'high': 0.05, 'vhigh': 0.005,
}
_NUM_TIERS = len(TIER_NAMES)


def round_robin(num_training_examples: Sequence[int]) -> np.ndarray:
  """RF²'s "Random" mapping as the reference code runs it: users ordered by
  number of training examples, most first (ties in user order), take tiers
  0, 1, 2, 0, 1, 2, ...; users without training examples (evaluated only)
  come last in that order. No randomness: tier sizes differ by at most one.

  Example: counts [1, 5, 0, 5, 3] order the users 1, 3, 4, 0, 2, so the
  tiers are [0, 0, 1, 1, 2].

  Args:
    num_training_examples: int [U], each user's training examples.

  Returns:
    int32 [U], each user's tier.
  """
  counts = np.asarray(num_training_examples)
  if counts.ndim != 1 or (counts.size and counts.min() < 0):
    raise ValueError(
        'num_training_examples must be 1-D [U] of counts >= 0; got shape '
        f'{counts.shape}.')
  order = np.argsort(-counts.astype(np.int64), kind='stable')
  tiers = np.empty(counts.size, np.int32)
  tiers[order] = np.arange(counts.size) % _NUM_TIERS
  return tiers


def _shares(rng: np.random.Generator, alpha: float) -> np.ndarray:
  """(p_L, p_M, p_S) ~ Dirichlet(alpha, alpha, alpha), sorted descending,
  drawn again while any is NaN."""
  shares = np.full(_NUM_TIERS, np.nan)
  while np.isnan(shares).any():
    shares = rng.dirichlet([alpha] * _NUM_TIERS)
  return np.sort(shares)[::-1]


def dirichlet(click_offsets: Sequence[int], clicked_items: Sequence[int],
              alpha: float, seed: int) -> np.ndarray:
  """Algorithm 1 of RF², as the reference code runs it (module docstring).

  Args:
    click_offsets: int [U + 1], CSR offsets: user u's clicks are
      `clicked_items[click_offsets[u]:click_offsets[u + 1]]`.
    clicked_items: int [C], the clicked item ids (any non-negative ids),
      every click event, repeats included.
    alpha: The Dirichlet concentration, > 0 (small: skewed tiers).
    seed: Seeds the shares and the shuffles.

  Returns:
    int32 [U], each user's tier.
  """
  offsets = np.asarray(click_offsets, np.int64)
  items = np.asarray(clicked_items, np.int64)
  if (offsets.ndim != 1 or offsets.size < 1 or offsets[0] != 0
      or offsets[-1] != items.size or np.any(np.diff(offsets) < 0)):
    raise ValueError(
        'click_offsets must be CSR offsets [U + 1] from 0 to the number of '
        f'clicks ({items.size}), non-decreasing.')
  if items.size and items.min() < 0:
    raise ValueError('clicked_items must be item ids >= 0.')
  if not (isinstance(alpha, (int, float)) and math.isfinite(alpha)
          and alpha > 0):
    raise ValueError(f'alpha must be a finite number above 0; got {alpha}.')
  num_users = offsets.size - 1
  counts = np.diff(offsets)
  user_of_click = np.repeat(np.arange(num_users), counts)
  # Null item -1: the users without clicks, one entry each.
  no_clicks = np.flatnonzero(counts == 0)
  items = np.concatenate([items, np.full(no_clicks.size, -1)])
  user_of_click = np.concatenate([user_of_click, no_clicks])
  # Clicks of one item together, each item's clicks in the given order.
  by_item = np.argsort(items, kind='stable')
  item_ids, starts, popularity = np.unique(
      items[by_item], return_index=True, return_counts=True)
  # Descending (popularity, id): the reverse of the ascending order.
  item_order = np.lexsort((item_ids, popularity))[::-1]

  rng = np.random.default_rng(seed)
  tiers = np.full(num_users, -1, np.int32)
  sizes = np.zeros(_NUM_TIERS, np.int64)
  for index in item_order:
    shares = _shares(rng, alpha)
    clickers = user_of_click[by_item[starts[index]:
                                     starts[index] + popularity[index]]]
    # Once each; the events are user-major, so user order is click order.
    clickers = np.unique(clickers)
    clickers = clickers[tiers[clickers] < 0]
    if clickers.size == 0:
      continue
    clickers = rng.permutation(clickers)
    smallest_first = np.lexsort((np.arange(_NUM_TIERS), sizes))
    scaled = shares * clickers.size
    cuts = [int(scaled[0]), int(scaled[0] + scaled[1])]
    for tier, part in zip(smallest_first, np.split(clickers, cuts)):
      tiers[part] = tier
      sizes[tier] += part.size
  return tiers


class RoundRobin:
  """The tier policy of `round_robin` (`tiers.ByInteractions` has the
  interface)."""

  tier_names = TIER_NAMES
  description = 'device tiers round_robin'

  def assign(self, train_offsets, train_items=None, seed: int = 0,
             clicks=None):
    del train_items, seed, clicks  # Deterministic, by training examples.
    return round_robin(np.diff(np.asarray(train_offsets)))


class Dirichlet:
  """The tier policy of `dirichlet` at `alpha`, by the users' training
  clicks: `clicks` (offsets, items) where the protocol labels events (the
  click-through task), else their training items (the reference code also
  counts their test clicks; a run's tiers here do not depend on its
  held-out data)."""

  tier_names = TIER_NAMES

  def __init__(self, alpha: float):
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha)
            and alpha > 0):
      raise ValueError(
          f'alpha must be a finite number above 0; got {alpha}.')
    self.alpha = float(alpha)

  @property
  def description(self) -> str:
    return f'device tiers dirichlet:{self.alpha:g}'

  def assign(self, train_offsets, train_items, seed: int = 0, clicks=None):
    offsets, items = clicks or (train_offsets, train_items)
    return dirichlet(offsets, items, self.alpha, seed)


def policy_from_flag(value: str):
  """The policy of a `--device_tiers` value: 'round_robin' or
  'dirichlet:ALPHA' (ALPHA > 0, e.g. 0.05; or a Sec. 5.3 level name,
  'dirichlet:vhigh')."""
  if value == 'round_robin':
    return RoundRobin()
  name, _, alpha = value.partition(':')
  if name == 'dirichlet' and alpha:
    if alpha in HETEROGENEITY_LEVELS:
      return Dirichlet(HETEROGENEITY_LEVELS[alpha])
    try:
      return Dirichlet(float(alpha))
    except ValueError:
      pass
  raise ValueError(
      f'{value!r} is not a device tier mapping: give round_robin or '
      'dirichlet:ALPHA with ALPHA a number above 0 (RF² Sec. 5.3: 5000, 5, '
      f'0.5, 0.05, 0.005) or a level ({", ".join(HETEROGENEITY_LEVELS)}).')
