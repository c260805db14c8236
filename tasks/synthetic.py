"""Synthetic implicit-feedback data: long-tailed, with a learnable structure.

Real recommendation data are long-tailed in two ways (Park & Tuzhilin 2008,
"The long tail of recommender systems and how to leverage it"): a few users
interact a lot, and a few items receive most interactions. The generator
reproduces both and plants a signal a model can learn:

* Each user draws an interaction count n_u from a lognormal distribution with
  mean `mean_interactions_per_user` (sigma = 1), rounded and clipped to
  [min_interactions_per_user, num_items // 2].
* Item i has popularity w_i = r_i^(-item_popularity_exponent), r_i being a
  random rank in 1..num_items (Zipf's law).
* Items fall into G latent clusters and users into G latent groups (G grows
  with num_items, up to 10); group g prefers cluster g:
      p(i | g) = q * w_i [c_i = g] / W_g + (1 - q) * w_i / W,   q = 0.7,
  where W_g and W normalise the two terms.
* User u's items are n_u draws from p(. | g_u) without replacement
  (successive sampling: the first n_u distinct items of an i.i.d. sequence),
  so there are no duplicate (user, item) pairs.
* Ratings are 1..5 with MovieLens-100K's marginal frequencies; each user's
  interactions come in a random order with strictly increasing timestamps.

Example:

  >>> frame = generate_interactions(num_users=3, num_items=50, seed=1)
  >>> list(frame.columns)
  ['user', 'item', 'rating', 'timestamp']
  >>> frame['user'].iloc[0]
  'u0'
"""

import dataclasses

import numpy as np
import pandas as pd

_MAX_GROUPS = 10
_MIN_ITEMS_PER_CLUSTER = 20
_IN_GROUP_PROBABILITY = 0.7
_COUNT_LOG_SIGMA = 1.0
# Share of ratings 1..5 in MovieLens-100K.
_RATING_FREQUENCIES = (0.06110, 0.11370, 0.27145, 0.34174, 0.21201)
# 2000-01-01 UTC; users start within 3 years and act at most a week apart.
_FIRST_TIMESTAMP = 946_684_800
_START_SPREAD_SECONDS = 3 * 365 * 86_400
_MAX_GAP_SECONDS = 7 * 86_400
# Rejection rounds before the remaining draws switch to Gumbel-top-k, which
# costs num_items per user but never stalls on a nearly exhausted support.
_REJECTION_ROUNDS = 16
_GUMBEL_CHUNK_ELEMENTS = 1 << 22


@dataclasses.dataclass(frozen=True, eq=False)
class SyntheticInteractions:
  """Generated interactions as integer arrays, grouped by user.

  Rows are sorted by user, then by timestamp.

  Attributes:
    user_index: int32 [N], in 0..num_users - 1, non-decreasing.
    item_index: int32 [N], in 0..num_items - 1.
    rating: float64 [N], in {1, ..., 5}.
    timestamp: float64 [N], whole seconds, strictly increasing per user.
    user_group: int32 [num_users], each user's latent group.
    item_cluster: int32 [num_items], each item's latent cluster; group g
      prefers cluster g.
    num_users: number of users.
    num_items: number of items.
  """

  user_index: np.ndarray
  item_index: np.ndarray
  rating: np.ndarray
  timestamp: np.ndarray
  user_group: np.ndarray
  item_cluster: np.ndarray
  num_users: int
  num_items: int


def generate_interactions(
    *,
    num_users: int,
    num_items: int,
    mean_interactions_per_user: float = 20.0,
    min_interactions_per_user: int = 5,
    item_popularity_exponent: float = 1.0,
    seed: int = 0,
) -> pd.DataFrame:
  """Generates a synthetic interaction table (see the module docstring).

  Returns:
    A DataFrame with the columns of `load_interactions_file`: user (str,
    "u<index>"), item (str, "i<index>"), rating (float64), timestamp
    (float64); one row per interaction, grouped by user in time order.
  """
  arrays = generate_interaction_arrays(
      num_users=num_users,
      num_items=num_items,
      mean_interactions_per_user=mean_interactions_per_user,
      min_interactions_per_user=min_interactions_per_user,
      item_popularity_exponent=item_popularity_exponent,
      seed=seed,
  )
  # Indexing arrays of the distinct names shares one str object per id,
  # which is far faster than formatting a string per row.
  user_names = np.array([f'u{u}' for u in range(num_users)], dtype=object)
  item_names = np.array([f'i{i}' for i in range(num_items)], dtype=object)
  return pd.DataFrame({
      'user': user_names[arrays.user_index],
      'item': item_names[arrays.item_index],
      'rating': arrays.rating,
      'timestamp': arrays.timestamp,
  })


def generate_interaction_arrays(
    *,
    num_users: int,
    num_items: int,
    mean_interactions_per_user: float = 20.0,
    min_interactions_per_user: int = 5,
    item_popularity_exponent: float = 1.0,
    seed: int = 0,
) -> SyntheticInteractions:
  """`generate_interactions` without building string ids.

  Same data (same seed, same rows) as `generate_interactions`, as integer
  indices plus the latent groups and clusters, for scales where a DataFrame
  of strings is the bottleneck.
  """
  max_count = num_items // 2
  if num_users < 1:
    raise ValueError(f'num_users must be >= 1; got {num_users}.')
  if not 1 <= min_interactions_per_user <= max_count:
    raise ValueError(
        'min_interactions_per_user must be in 1..num_items // 2 = '
        f'{max_count}; got {min_interactions_per_user}. Use more items or '
        'a smaller minimum.'
    )
  if mean_interactions_per_user <= 0:
    raise ValueError(
        'mean_interactions_per_user must be positive; got '
        f'{mean_interactions_per_user}.'
    )
  if item_popularity_exponent < 0:
    raise ValueError(
        'item_popularity_exponent must be >= 0; got '
        f'{item_popularity_exponent}.'
    )
  rng = np.random.default_rng(seed)
  num_groups = int(np.clip(num_items // _MIN_ITEMS_PER_CLUSTER, 1, _MAX_GROUPS))
  item_cluster = (rng.permutation(num_items) % num_groups).astype(np.int32)
  user_group = rng.integers(0, num_groups, num_users).astype(np.int32)
  popularity = (rng.permutation(num_items) + 1.0) ** -item_popularity_exponent
  item_probabilities = _group_item_probabilities(
      popularity, item_cluster, num_groups
  )

  # E[lognormal(mu, sigma)] = exp(mu + sigma^2 / 2).
  log_mean = np.log(mean_interactions_per_user) - _COUNT_LOG_SIGMA**2 / 2
  counts = np.clip(
      np.rint(rng.lognormal(log_mean, _COUNT_LOG_SIGMA, num_users)),
      min_interactions_per_user,
      max_count,
  ).astype(np.int64)

  keys = _sample_without_replacement(
      item_probabilities, user_group, counts, rng
  )
  num_rows = keys.size
  user_index = (keys // num_items).astype(np.int32)
  item_index = (keys % num_items).astype(np.int32)
  # keys are sorted by (user, item); a random key per row shuffles each
  # user's items into a random time order.
  order = np.argsort(
      (user_index.astype(np.int64) << 32)
      | rng.integers(0, 1 << 32, num_rows, dtype=np.int64)
  )
  item_index = item_index[order]

  offsets = np.concatenate([[0], np.cumsum(counts)])
  gaps = rng.integers(1, _MAX_GAP_SECONDS, num_rows, dtype=np.int64)
  elapsed = np.cumsum(gaps)
  # Restart the running sum at each user's first row.
  elapsed -= np.repeat(elapsed[offsets[:-1]] - gaps[offsets[:-1]], counts)
  starts = _FIRST_TIMESTAMP + rng.integers(
      0, _START_SPREAD_SECONDS, num_users, dtype=np.int64
  )
  timestamp = (np.repeat(starts, counts) + elapsed).astype(np.float64)
  rating_cdf = np.cumsum(_RATING_FREQUENCIES) / sum(_RATING_FREQUENCIES)
  # Inverse CDF by counting thresholds passed: with five values this is
  # several times faster than searchsorted.
  rating = 1.0 + np.sum(
      rng.random(num_rows)[:, None] >= rating_cdf[:-1], axis=1
  )
  return SyntheticInteractions(
      user_index=user_index,
      item_index=item_index,
      rating=rating,
      timestamp=timestamp,
      user_group=user_group,
      item_cluster=item_cluster,
      num_users=num_users,
      num_items=num_items,
  )


def _group_item_probabilities(
    popularity: np.ndarray, item_cluster: np.ndarray, num_groups: int
) -> np.ndarray:
  """p(i | g) of the module docstring, float64 [num_groups, num_items]."""
  in_cluster = item_cluster[None, :] == np.arange(num_groups)[:, None]
  cluster_weights = np.where(in_cluster, popularity[None, :], 0.0)
  return (
      _IN_GROUP_PROBABILITY
      * cluster_weights
      / cluster_weights.sum(axis=1, keepdims=True)
      + (1 - _IN_GROUP_PROBABILITY) * popularity / popularity.sum()
  )


def _sample_without_replacement(
    item_probabilities: np.ndarray,
    user_group: np.ndarray,
    counts: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
  """counts[u] distinct items per user u, drawn by successive sampling.

  Each round draws one i.i.d. item per missing slot and keeps the draws not
  yet held by the user; concatenated, the rounds are one i.i.d. sequence
  per user cut at its n_u-th distinct item, i.e. successive sampling. Users
  still short after _REJECTION_ROUNDS rounds (those whose remaining items
  are rare) finish with Gumbel-top-k, which continues the same successive
  sampling exactly (Kool et al. 2019, "Stochastic Beams and Where to Find
  Them: The Gumbel-Top-k Trick").

  Args:
    item_probabilities: float64 [G, I], p(i | g); rows sum to 1.
    user_group: int [U], in 0..G - 1.
    counts: int64 [U], each at most I.
    rng: the generator all draws come from.

  Returns:
    int64 [sum(counts)], sorted keys user * I + item.
  """
  num_groups, num_items = item_probabilities.shape
  # One CDF per group, block g shifted to [2g, 2g + 1] so that one
  # searchsorted serves every group; the gap of 1 keeps a draw that rounds
  # up to 2g + 1 from landing in block g + 1.
  cdf = np.cumsum(item_probabilities, axis=1)
  cdf /= cdf[:, -1:]
  flat_cdf = (cdf + 2.0 * np.arange(num_groups)[:, None]).ravel()

  def draw(users: np.ndarray) -> np.ndarray:
    groups = user_group[users].astype(np.int64)
    positions = np.searchsorted(
        flat_cdf, 2.0 * groups + rng.random(users.size), side='right'
    )
    items = np.minimum(positions - groups * num_items, num_items - 1)
    return users * num_items + items

  users = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
  held = np.unique(draw(users))
  missing = counts - np.bincount(held // num_items, minlength=counts.size)
  # Keys accepted after the first round, kept apart so each round merges
  # only small arrays.
  added = np.empty(0, np.int64)
  for _ in range(_REJECTION_ROUNDS):
    if not missing.any():
      break
    candidates = np.unique(
        draw(np.repeat(np.arange(counts.size, dtype=np.int64), missing))
    )
    new = candidates[
        ~(_contains(held, candidates) | _contains(added, candidates))
    ]
    added = np.union1d(added, new)
    missing -= np.bincount(new // num_items, minlength=counts.size)
  if missing.any():
    added = np.union1d(
        added,
        _gumbel_top_k(
            item_probabilities, user_group, missing, _merge(held, added), rng
        ),
    )
  return _merge(held, added)


def _gumbel_top_k(
    item_probabilities: np.ndarray,
    user_group: np.ndarray,
    missing: np.ndarray,
    held: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
  """missing[u] more distinct items for each user u, none of them in held.

  The top-k items by log p(i | g_u) + Gumbel noise are a successive sample
  of size k (Kool et al. 2019).

  Returns:
    int64 [sum(missing)], keys user * I + item.
  """
  num_items = item_probabilities.shape[1]
  short_users = np.flatnonzero(missing)
  log_probabilities = np.log(item_probabilities)
  chunk = max(1, _GUMBEL_CHUNK_ELEMENTS // num_items)
  keys = []
  for start in range(0, short_users.size, chunk):
    users = short_users[start : start + chunk]
    scores = log_probabilities[user_group[users]] + rng.gumbel(
        size=(users.size, num_items)
    )
    row_start = users[:, None] * num_items
    held_mask = _contains(held, row_start + np.arange(num_items))
    scores[held_mask] = -np.inf
    ranked = np.argsort(-scores, axis=1)
    take = np.arange(num_items) < missing[users][:, None]
    keys.append((row_start + ranked)[take])
  return np.concatenate(keys)


def _merge(sorted_keys: np.ndarray, other_keys: np.ndarray) -> np.ndarray:
  """The sorted union of two disjoint sorted arrays, in linear time."""
  return np.insert(
      sorted_keys, np.searchsorted(sorted_keys, other_keys), other_keys
  )


def _contains(sorted_keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
  """Whether each query occurs in sorted_keys; bool, shaped like queries."""
  if sorted_keys.size == 0:
    return np.zeros(queries.shape, bool)
  positions = np.minimum(
      np.searchsorted(sorted_keys, queries), sorted_keys.size - 1
  )
  return sorted_keys[positions] == queries
