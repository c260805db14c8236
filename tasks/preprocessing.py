"""The papers' preprocessing: implicit feedback, splits and negative sampling.

Protocols implemented:

* Implicit feedback (NCF, He et al. 2017, Sec. 4.1; PFedRec, Zhang et al.
  2023): every rated (user, item) pair is a positive, whatever the rating.
* Leave-one-out (NCF Sec. 4.1, used by PFedRec): per user, the latest
  interaction is the test item, the second latest the validation item, the
  rest is training data; each held-out item is ranked against
  `num_eval_negatives` (99) sampled never-interacted items.
* Random 80/20 split (HeteFedRec, Yuan et al. 2024): a random 80% of each
  user's interactions for training, the rest for testing.
* Training negatives (NCF Sec. 3.1.1): each round every training positive is
  paired with `negatives_per_positive` (4) items the user never interacted
  with, resampled every round.

Per-user lists are stored in CSR layout so that millions of users cost flat
arrays, not Python lists: user u's entries of `X_items` are
`X_items[X_offsets[u]:X_offsets[u + 1]]`.

Example:

  >>> frame = pd.DataFrame({
  ...     'user': ['a', 'a', 'a', 'b', 'b', 'b'],
  ...     'item': ['x', 'y', 'z', 'y', 'z', 'w'],
  ...     'rating': 5.0, 'timestamp': [1., 2., 3., 3., 2., 1.]})
  >>> data = leave_one_out_split(index_interactions(frame),
  ...                            num_eval_negatives=0)
  >>> data.test_items, data.val_items   # items indexed x=0 y=1 z=2 w=3
  (array([2, 1], dtype=int32), array([1, 2], dtype=int32))
  >>> data.train_items
  array([0, 3], dtype=int32)
"""

import dataclasses

import numpy as np
import pandas as pd

from tff_fedrec.tasks import errors

# Evaluation-negative slots sampled at once; bounds the temporary arrays of
# `leave_one_out_split` for millions of users.
_SLOTS_PER_CHUNK = 1 << 22


@dataclasses.dataclass(frozen=True, eq=False)
class IndexedInteractions:
  """Deduplicated positives with ids mapped to contiguous indices.

  Rows keep the relative order of the input rows.

  Attributes:
    user_index: int32 [N], in 0..num_users - 1.
    item_index: int32 [N], in 0..num_items - 1.
    timestamp: float64 [N].
    user_ids: [num_users] original ids; user_ids[user_index[n]] is row n's.
    item_ids: [num_items] original ids.
    num_users: number of users.
    num_items: number of items.
  """

  user_index: np.ndarray
  item_index: np.ndarray
  timestamp: np.ndarray
  user_ids: np.ndarray
  item_ids: np.ndarray
  num_users: int
  num_items: int


@dataclasses.dataclass(frozen=True, eq=False)
class LeaveOneOutData:
  """A leave-one-out split with its evaluation negatives (NCF Sec. 4.1).

  Attributes:
    num_users, num_items, user_ids, item_ids: as in IndexedInteractions.
    train_offsets: int64 [num_users + 1].
    train_items: int32 [num_train]; each user's training positives, oldest
      first.
    interacted_offsets: int64 [num_users + 1].
    interacted_items: int32 [N]; all of each user's items (training,
      validation and test), ascending within each user. Negatives are
      drawn from the complement.
    val_items: int32 [num_users]; each user's second latest item.
    test_items: int32 [num_users]; each user's latest item.
    val_negatives: int32 [num_users, num_eval_negatives].
    test_negatives: int32 [num_users, num_eval_negatives]; distinct from
      each other and from val_negatives, never interacted.
  """

  num_users: int
  num_items: int
  user_ids: np.ndarray
  item_ids: np.ndarray
  train_offsets: np.ndarray
  train_items: np.ndarray
  interacted_offsets: np.ndarray
  interacted_items: np.ndarray
  val_items: np.ndarray
  test_items: np.ndarray
  val_negatives: np.ndarray
  test_negatives: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class RandomSplitData:
  """A per-user random train/test split (HeteFedRec's protocol).

  Attributes:
    num_users, num_items, user_ids, item_ids: as in IndexedInteractions.
    train_offsets: int64 [num_users + 1].
    train_items: int32 [num_train]; oldest first within each user.
    test_offsets: int64 [num_users + 1].
    test_items: int32 [num_test]; oldest first within each user.
    interacted_offsets: int64 [num_users + 1].
    interacted_items: int32 [N]; training and test items, ascending within
      each user (what `sample_training_examples` excludes).
  """

  num_users: int
  num_items: int
  user_ids: np.ndarray
  item_ids: np.ndarray
  train_offsets: np.ndarray
  train_items: np.ndarray
  test_offsets: np.ndarray
  test_items: np.ndarray
  interacted_offsets: np.ndarray
  interacted_items: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class TrainingExamples:
  """One round's labelled training examples, per user in CSR layout.

  User u's segment holds its n_u training positives (label 1) and
  negatives_per_positive * n_u negatives (label 0) in random order.

  Attributes:
    offsets: int64 [num_users + 1].
    items: int32 [total].
    labels: float32 [total], 1.0 or 0.0.
  """

  offsets: np.ndarray
  items: np.ndarray
  labels: np.ndarray


def index_interactions(
    frame: pd.DataFrame,
    *,
    min_interactions_per_user: int = 0,
) -> IndexedInteractions:
  """Binarises interactions and maps ids to contiguous indices.

  Every row is a positive (implicit feedback; ratings are ignored). A
  (user, item) pair that occurs more than once keeps its latest timestamp
  (the later row on ties). Users with fewer than min_interactions_per_user
  distinct items are then dropped. Users and items are indexed in order of
  first appearance among the remaining rows.

  Args:
    frame: N rows with columns user, item and timestamp, e.g. from
      `load_interactions_file`.
    min_interactions_per_user: drop users with fewer distinct items.

  Returns:
    IndexedInteractions with one row per remaining (user, item) pair.
  """
  user_codes, user_ids = pd.factorize(frame['user'])
  item_codes, item_ids = pd.factorize(frame['item'])
  timestamp = frame['timestamp'].to_numpy(np.float64)
  pair = user_codes.astype(np.int64) * len(item_ids) + item_codes
  rows = _latest_row_of_each_pair(pair, timestamp)

  counts = np.bincount(user_codes[rows], minlength=len(user_ids))
  rows = rows[counts[user_codes[rows]] >= min_interactions_per_user]

  # Re-factorising the codes gives first-appearance order of what is left.
  user_index, kept_users = pd.factorize(user_codes[rows])
  item_index, kept_items = pd.factorize(item_codes[rows])
  return IndexedInteractions(
      user_index=user_index.astype(np.int32),
      item_index=item_index.astype(np.int32),
      timestamp=timestamp[rows],
      user_ids=np.asarray(user_ids)[kept_users],
      item_ids=np.asarray(item_ids)[kept_items],
      num_users=len(kept_users),
      num_items=len(kept_items),
  )


def leave_one_out_split(
    indexed: IndexedInteractions,
    *,
    num_eval_negatives: int = 99,
    seed: int = 0,
) -> LeaveOneOutData:
  """Splits each user's history by time and samples evaluation negatives.

  Each user's rows are ranked from the latest timestamp down, tied rows
  in file order, as the NCF and PFedRec reference code's `groupby(user)
  .timestamp.rank(method='first', ascending=False)` ranks them: rank 1 is
  the test item, rank 2 the validation item (so of two rows tied at the
  latest timestamp the first in the file is the test item). The training
  items are the rest, oldest first. Each user then gets
  2 * num_eval_negatives distinct items it never interacted with, drawn
  uniformly: the first half are the validation negatives, the second half
  the test negatives.

  Raises:
    DataFormatError: a user has fewer than 3 interactions, or fewer than
      2 * num_eval_negatives items it never interacted with.
  """
  if num_eval_negatives < 0:
    raise ValueError(
        f'num_eval_negatives must be >= 0; got {num_eval_negatives}.'
    )
  order, offsets = _group_by_user_in_time_order(indexed, ties='latest_first')
  counts = np.diff(offsets)
  _check_min_count(
      indexed,
      counts,
      3,
      'leave-one-out needs one training, '
      'one validation and one test item per user',
  )
  items = indexed.item_index[order]
  test_items = items[offsets[1:] - 1]
  val_items = items[offsets[1:] - 2]
  is_train = np.ones(items.size, bool)
  is_train[offsets[1:] - 1] = False
  is_train[offsets[1:] - 2] = False
  interacted_offsets, interacted_items = _interacted(indexed)

  needed = 2 * num_eval_negatives
  never_interacted = indexed.num_items - counts
  if (never_interacted < needed).any():
    user = int(np.argmax(never_interacted < needed))
    raise errors.DataFormatError(
        f'user {indexed.user_ids[user]!r} interacted with {counts[user]} '
        f'of {indexed.num_items} items, leaving {never_interacted[user]} '
        f'never-interacted items, but 2 x {num_eval_negatives} distinct '
        'evaluation negatives are needed (--num_eval_negatives, for the '
        'validation and the test item). Lower --num_eval_negatives to at '
        f'most {never_interacted.min() // 2}, or use a data set with more '
        'items per user.'
    )
  negatives = _sample_distinct_negatives(
      interacted_offsets,
      interacted_items,
      indexed.num_items,
      needed,
      np.random.default_rng(seed),
  )
  return LeaveOneOutData(
      num_users=indexed.num_users,
      num_items=indexed.num_items,
      user_ids=indexed.user_ids,
      item_ids=indexed.item_ids,
      train_offsets=offsets - 2 * np.arange(offsets.size, dtype=np.int64),
      train_items=items[is_train],
      interacted_offsets=interacted_offsets,
      interacted_items=interacted_items,
      val_items=val_items,
      test_items=test_items,
      val_negatives=negatives[:, :num_eval_negatives],
      test_negatives=negatives[:, num_eval_negatives:],
  )


def random_split(
    indexed: IndexedInteractions,
    *,
    train_fraction: float = 0.8,
    seed: int = 0,
) -> RandomSplitData:
  """Splits each user's interactions at random (HeteFedRec's protocol).

  User u keeps round(train_fraction * n_u) of its n_u interactions for
  training (halves round up), clipped to 1..n_u - 1 so that both parts are
  non-empty; which ones is uniformly random. Both parts keep time order.

  Raises:
    DataFormatError: a user has fewer than 2 interactions.
  """
  if not 0 < train_fraction < 1:
    raise ValueError(f'train_fraction must be in (0, 1); got {train_fraction}.')
  order, offsets = _group_by_user_in_time_order(indexed)
  counts = np.diff(offsets)
  _check_min_count(
      indexed,
      counts,
      2,
      'a random split needs at least one training and one test item per user',
  )
  rng = np.random.default_rng(seed)
  num_train = np.clip(
      np.floor(train_fraction * counts + 0.5), 1, counts - 1
  ).astype(np.int64)
  user_of_row = np.repeat(np.arange(indexed.num_users), counts)
  # Ranking each user's rows by a random key picks a uniform subset.
  shuffled = _shuffle_within_users(user_of_row, rng)
  rank = np.empty(shuffled.size, np.int64)
  rank[shuffled] = np.arange(shuffled.size) - offsets[user_of_row]
  is_train = rank < num_train[user_of_row]
  items = indexed.item_index[order]
  interacted_offsets, interacted_items = _interacted(indexed)
  return RandomSplitData(
      num_users=indexed.num_users,
      num_items=indexed.num_items,
      user_ids=indexed.user_ids,
      item_ids=indexed.item_ids,
      train_offsets=_offsets(num_train),
      train_items=items[is_train],
      test_offsets=_offsets(counts - num_train),
      test_items=items[~is_train],
      interacted_offsets=interacted_offsets,
      interacted_items=interacted_items,
  )


def sample_training_examples(
    *,
    train_offsets: np.ndarray,
    train_items: np.ndarray,
    interacted_offsets: np.ndarray,
    interacted_items: np.ndarray,
    num_items: int,
    negatives_per_positive: int = 4,
    rng: np.random.Generator,
    distinct_per_positive: bool = False,
) -> TrainingExamples:
  """One round of training examples for every user (NCF Sec. 3.1.1).

  Each training positive is kept (label 1) and joined by
  negatives_per_positive negatives (label 0), each uniform over the items
  the user never interacted with: independently (with replacement, as in
  NCF), or with `distinct_per_positive` the k of one positive distinct
  from each other (a uniform k-subset, as PFedRec's reference code's
  `random.sample` draws them; a user with fewer than k such items draws
  with replacement). A fresh call draws fresh negatives. Each user's
  examples are then shuffled.

  A negative is drawn as a uniform rank r among the user's c_u
  never-interacted items and mapped to the r-th such item directly, so,
  unlike rejection sampling, the cost does not grow for users who
  interacted with most items.

  Args:
    train_offsets: int64 [U + 1].
    train_items: int [num_train], the positives.
    interacted_offsets: int64 [U + 1].
    interacted_items: int [N], every item of each user (at least its
      training items), ascending and distinct within each user.
    num_items: size of the item vocabulary.
    negatives_per_positive: k.
    rng: source of the negatives and the shuffle.

  Returns:
    TrainingExamples; user u's segment has (1 + k) * n_u examples.

  Raises:
    ValueError: a user with training positives interacted with every item.
  """
  train_offsets = np.asarray(train_offsets, np.int64)
  interacted_offsets = np.asarray(interacted_offsets, np.int64)
  num_users = train_offsets.size - 1
  positives = np.diff(train_offsets)
  free = num_items - np.diff(interacted_offsets)
  if ((free == 0) & (positives > 0)).any():
    user = int(np.argmax((free == 0) & (positives > 0)))
    raise ValueError(
        f'user {user} interacted with all {num_items} items, '
        'so it has no negatives to sample.'
    )
  per_user = (1 + negatives_per_positive) * positives
  offsets = _offsets(per_user)
  negative_users = np.repeat(
      np.arange(num_users), negatives_per_positive * positives
  )
  if distinct_per_positive and negatives_per_positive > 1:
    ranks = _uniform_ranks(free[negative_users], rng).reshape(
        -1, negatives_per_positive)
    positive_users = negative_users[::negatives_per_positive]
    enough = free[positive_users] >= negatives_per_positive
    ranks[enough] = _distinct_ranks(
        free[positive_users[enough]], negatives_per_positive, rng)
    ranks = ranks.reshape(-1)
  else:
    ranks = _uniform_ranks(free[negative_users], rng)
  negatives = _never_interacted_items(
      _free_rank_keys(interacted_offsets, interacted_items, num_items),
      interacted_offsets,
      num_items,
      negative_users,
      ranks,
  )

  # Each user's segment: positives first, then negatives, then shuffled.
  items = np.empty(offsets[-1], np.int32)
  labels = np.zeros(offsets[-1], np.float32)
  is_positive = (
      np.arange(offsets[-1]) - np.repeat(offsets[:-1], per_user)
  ) < np.repeat(positives, per_user)
  items[is_positive] = train_items
  items[~is_positive] = negatives
  labels[is_positive] = 1.0
  user_of_example = np.repeat(np.arange(num_users), per_user)
  shuffled = _shuffle_within_users(user_of_example, rng)
  return TrainingExamples(
      offsets=offsets, items=items[shuffled], labels=labels[shuffled]
  )


def user_examples(
    examples: TrainingExamples, user: int
) -> tuple[np.ndarray, np.ndarray]:
  """User u's (items int32 [n], labels float32 [n]) from TrainingExamples."""
  start, stop = examples.offsets[user], examples.offsets[user + 1]
  return examples.items[start:stop], examples.labels[start:stop]


def _offsets(counts: np.ndarray) -> np.ndarray:
  """CSR offsets, int64 [len(counts) + 1], of per-user counts."""
  return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])


def _latest_row_of_each_pair(
    pair: np.ndarray, timestamp: np.ndarray
) -> np.ndarray:
  """Ascending rows that keep, per pair key, the latest (timestamp, row).

  Data sets rarely repeat a pair, so only the rows of repeated pairs go
  through the slow three-key sort.
  """
  order = np.argsort(pair, kind='stable')
  same_as_next = pair[order[1:]] == pair[order[:-1]]
  repeated = np.zeros(pair.size, bool)
  repeated[:-1] |= same_as_next
  repeated[1:] |= same_as_next
  candidates = order[repeated]
  candidates = candidates[
      np.lexsort((candidates, timestamp[candidates], pair[candidates]))
  ]
  superseded = candidates[:-1][pair[candidates[1:]] == pair[candidates[:-1]]]
  keep = np.ones(pair.size, bool)
  keep[superseded] = False
  return np.flatnonzero(keep)


def _group_by_user_in_time_order(
    indexed: IndexedInteractions, ties: str = 'file_order',
) -> tuple[np.ndarray, np.ndarray]:
  """Rows sorted by (user, timestamp), and the users' CSR offsets; rows tied
  in both come in file order, or (`ties='latest_first'`) in reverse file
  order, so that the last of a user's rows is the first in the file of
  those at its latest timestamp."""
  rows = np.arange(indexed.user_index.size)
  order = np.lexsort((
      -rows if ties == 'latest_first' else rows,
      indexed.timestamp,
      indexed.user_index,
  ))
  counts = np.bincount(indexed.user_index, minlength=indexed.num_users)
  return order, _offsets(counts)


def _check_min_count(
    indexed: IndexedInteractions, counts: np.ndarray, minimum: int, reason: str
) -> None:
  if (counts < minimum).any():
    user = int(np.argmax(counts < minimum))
    raise errors.DataFormatError(
        f'user {indexed.user_ids[user]!r} has {counts[user]} '
        f'interaction(s), but {reason}. Drop such users with '
        f'--min_interactions={minimum} (min_interactions_per_user in '
        '`datasets.DataConfig` or `index_interactions`).'
    )


def distinct_items_per_user(
    offsets: np.ndarray, items: np.ndarray, num_items: int
) -> tuple[np.ndarray, np.ndarray]:
  """CSR (offsets int64 [U + 1], items int32) of each user's distinct items
  of segments `items[offsets[u]:offsets[u + 1]]`, ascending per user (the
  form `sample_training_examples` takes its excluded items in)."""
  offsets = np.asarray(offsets, np.int64)
  num_users = offsets.size - 1
  users = np.repeat(np.arange(num_users), np.diff(offsets))
  return _distinct_pairs(users, items, num_users, num_items)


def _distinct_pairs(
    users: np.ndarray, items: np.ndarray, num_users: int, num_items: int
) -> tuple[np.ndarray, np.ndarray]:
  """CSR offsets and items of the distinct (user, item) pairs, ascending
  per user."""
  keys = np.unique(
      np.asarray(users, np.int64) * num_items + np.asarray(items, np.int64)
  )
  counts = np.bincount(keys // num_items, minlength=num_users)
  return _offsets(counts), (keys % num_items).astype(np.int32)


def _interacted(indexed: IndexedInteractions) -> tuple[np.ndarray, np.ndarray]:
  """CSR offsets and items of every user's items, ascending per user."""
  return _distinct_pairs(indexed.user_index, indexed.item_index,
                         indexed.num_users, indexed.num_items)


def _shuffle_within_users(
    user_of_row: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
  """A permutation of rows that keeps users' blocks and shuffles each one.

  Args:
    user_of_row: int [R], non-decreasing.

  Returns:
    int64 [R]; rows[result] lists each user's rows in uniform random order.
  """
  # Rows of one user that draw the same 32 random bits (chance about
  # n^2 / 2^33 for n rows) keep an arbitrary order: a negligible bias.
  keys = (user_of_row.astype(np.int64) << 32) | rng.integers(
      0, 1 << 32, user_of_row.size, dtype=np.int64
  )
  return np.argsort(keys)


def _free_rank_keys(
    interacted_offsets: np.ndarray, interacted_items: np.ndarray, num_items: int
) -> np.ndarray:
  """Sorted keys that map ranks among never-interacted items to items.

  If a_0 < a_1 < ... are user u's interacted items, b_j = a_j - j counts
  the never-interacted items below a_j, so the r-th (0-based)
  never-interacted item is r + #{j : b_j <= r}. Keying b_j by
  u * (num_items + 1) puts all users in one sorted array.

  Returns:
    int64 [N], for `_never_interacted_items`.
  """
  counts = np.diff(interacted_offsets)
  owner = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
  position = np.arange(interacted_items.size) - interacted_offsets[owner]
  return owner * (num_items + 1) + (interacted_items - position)


def _never_interacted_items(
    free_rank_keys: np.ndarray,
    interacted_offsets: np.ndarray,
    num_items: int,
    users: np.ndarray,
    ranks: np.ndarray,
) -> np.ndarray:
  """The ranks[j]-th (0-based) item that users[j] never interacted with.

  Returns:
    int32, shaped like ranks.
  """
  users = users.astype(np.int64)
  skipped = (
      np.searchsorted(
          free_rank_keys, users * (num_items + 1) + ranks, side='right'
      )
      - interacted_offsets[users]
  )
  return (ranks + skipped).astype(np.int32)


def _uniform_ranks(free: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """A uniform int64 in 0..free[j] - 1 for each j (free[j] >= 1)."""
  ranks = (rng.random(free.size) * free).astype(np.int64)
  # Guards the float product rounding up to free[j] itself.
  return np.minimum(ranks, free - 1)


def _sample_distinct_negatives(
    interacted_offsets: np.ndarray,
    interacted_items: np.ndarray,
    num_items: int,
    per_user: int,
    rng: np.random.Generator,
) -> np.ndarray:
  """per_user distinct never-interacted items per user, uniformly.

  Users are processed in chunks of about _SLOTS_PER_CHUNK slots so that
  memory stays bounded for millions of users.

  Returns:
    int32 [U, per_user].
  """
  num_users = interacted_offsets.size - 1
  free = num_items - np.diff(interacted_offsets)
  free_rank_keys = _free_rank_keys(
      interacted_offsets, interacted_items, num_items
  )
  negatives = np.empty((num_users, per_user), np.int32)
  chunk = max(1, _SLOTS_PER_CHUNK // max(1, per_user))
  for start in range(0, num_users, chunk):
    users = np.arange(start, min(start + chunk, num_users))
    ranks = _distinct_ranks(free[users], per_user, rng)
    negatives[users] = _never_interacted_items(
        free_rank_keys,
        interacted_offsets,
        num_items,
        np.repeat(users, per_user),
        ranks.ravel(),
    ).reshape(ranks.shape)
  return negatives


def _distinct_ranks(
    free: np.ndarray, per_user: int, rng: np.random.Generator
) -> np.ndarray:
  """per_user distinct uniform ranks in 0..free[u] - 1 for each user u.

  Every slot draws a uniform rank; a slot repeating a rank held by an
  earlier slot of its row is redrawn, until no row has repeats. The
  process treats all ranks alike, so each ordered tuple of distinct ranks
  is equally likely and any slice of a row is a uniform sample. Each round
  sorts only the rows that still have repeats; with free[u] >= per_user a
  row needs about per_user rounds at worst (free[u] == per_user, waiting
  for its last rank).

  Args:
    free: int64 [U], each >= per_user.

  Returns:
    int64 [U, per_user].
  """
  ranks = _uniform_ranks(np.repeat(free, per_user), rng).reshape(
      free.size, per_user
  )
  rows = np.arange(free.size)
  while rows.size:
    block = ranks[rows]
    order = np.argsort(block, axis=1, kind='stable')
    in_order = np.take_along_axis(block, order, axis=1)
    # A stable sort lists a rank's earliest slot first, so the slots
    # after it in sorted order are the repeats.
    repeats = np.zeros(block.shape, bool)
    np.put_along_axis(
        repeats, order[:, 1:], in_order[:, 1:] == in_order[:, :-1], axis=1
    )
    has_repeats = repeats.any(axis=1)
    rows, block, repeats = (
        rows[has_repeats],
        block[has_repeats],
        repeats[has_repeats],
    )
    block[repeats] = _uniform_ranks(
        np.broadcast_to(free[rows][:, None], block.shape)[repeats], rng
    )
    ranks[rows] = block
  return ranks
