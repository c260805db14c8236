import numpy as np
import pandas as pd
import pytest

from tff_fedrec.tasks import errors
from tff_fedrec.tasks import preprocessing
from tff_fedrec.tasks import synthetic


def _frame(rows):
  users, items, timestamps = zip(*rows)
  return pd.DataFrame({
      'user': list(users),
      'item': list(items),
      'rating': 3.0,
      'timestamp': np.array(timestamps, np.float64),
  })


def _segments(offsets, values):
  return [
      values[offsets[u] : offsets[u + 1]].tolist()
      for u in range(len(offsets) - 1)
  ]


def _indexed_from_lists(item_lists, num_items):
  """IndexedInteractions of users with the given item lists, in time order."""
  users = np.repeat(
      np.arange(len(item_lists)), [len(items) for items in item_lists]
  )
  items = np.concatenate([np.asarray(items, np.int32) for items in item_lists])
  return preprocessing.IndexedInteractions(
      user_index=users.astype(np.int32),
      item_index=items,
      timestamp=np.arange(users.size, dtype=np.float64),
      user_ids=np.array([f'u{u}' for u in range(len(item_lists))], object),
      item_ids=np.array([f'i{i}' for i in range(num_items)], object),
      num_users=len(item_lists),
      num_items=num_items,
  )


# index_interactions

_DUPLICATES = [
    ('b', 'x', 10),  # row 0: superseded by row 2 (later timestamp)
    ('a', 'y', 20),  # row 1: superseded by row 6 (same timestamp, later row)
    ('b', 'x', 30),  # row 2
    ('a', 'z', 5),  # row 3
    ('c', 'x', 1),  # row 4
    ('b', 'y', 30),  # row 5
    ('a', 'y', 20),  # row 6
]


def test_index_deduplicates_keeping_latest_and_indexes_by_first_appearance():
  indexed = preprocessing.index_interactions(_frame(_DUPLICATES))

  # Kept rows 2..6; users in first appearance b, a, c; items x, z, y.
  assert indexed.user_ids.tolist() == ['b', 'a', 'c']
  assert indexed.item_ids.tolist() == ['x', 'z', 'y']
  assert (indexed.num_users, indexed.num_items) == (3, 3)
  np.testing.assert_array_equal(indexed.user_index, [0, 1, 2, 0, 1])
  np.testing.assert_array_equal(indexed.item_index, [0, 1, 0, 2, 2])
  np.testing.assert_array_equal(indexed.timestamp, [30, 5, 1, 30, 20])
  assert indexed.user_index.dtype == np.int32
  assert indexed.item_index.dtype == np.int32
  assert indexed.timestamp.dtype == np.float64


def test_index_drops_users_below_the_minimum_after_deduplication():
  # After deduplication b and a have 2 items, c has 1 (b has 3 raw rows).
  indexed = preprocessing.index_interactions(
      _frame(_DUPLICATES), min_interactions_per_user=2
  )

  assert indexed.user_ids.tolist() == ['b', 'a']
  assert indexed.item_ids.tolist() == ['x', 'z', 'y']
  np.testing.assert_array_equal(indexed.user_index, [0, 1, 0, 1])
  np.testing.assert_array_equal(indexed.item_index, [0, 1, 2, 2])

  none_left = preprocessing.index_interactions(
      _frame(_DUPLICATES), min_interactions_per_user=3
  )
  assert (none_left.num_users, none_left.num_items) == (0, 0)


def test_index_keeps_items_only_seen_by_dropped_users_out():
  indexed = preprocessing.index_interactions(
      _frame([('a', 'x', 1), ('b', 'w', 2), ('a', 'y', 3)]),
      min_interactions_per_user=2,
  )

  assert indexed.item_ids.tolist() == ['x', 'y']
  np.testing.assert_array_equal(indexed.item_index, [0, 1])


def test_index_matches_a_pandas_reference_on_many_duplicates():
  rng = np.random.default_rng(0)
  users = rng.integers(0, 8, 2000)
  # User u picks among 4 (u + 1) items, so the users with u < 4 end up
  # with fewer than 20 distinct items.
  items = (rng.random(2000) * 4 * (users + 1)).astype(int)
  frame = pd.DataFrame({
      'user': [f'user{u}' for u in users],
      'item': [f'm{i}' for i in items],
      'rating': 1.0,
      'timestamp': rng.integers(0, 20, 2000).astype(np.float64),
  })

  indexed = preprocessing.index_interactions(
      frame, min_interactions_per_user=20
  )

  # The latest (timestamp, row) of each pair, in row order.
  reference = (
      frame.reset_index()
      .sort_values(['timestamp', 'index'])
      .drop_duplicates(['user', 'item'], keep='last')
      .sort_values('index')
  )
  counts = reference['user'].value_counts()
  reference = reference[reference['user'].map(counts) >= 20]
  assert reference['user'].nunique() == 4
  np.testing.assert_array_equal(
      indexed.user_ids[indexed.user_index], reference['user']
  )
  np.testing.assert_array_equal(
      indexed.item_ids[indexed.item_index], reference['item']
  )
  np.testing.assert_array_equal(indexed.timestamp, reference['timestamp'])
  assert indexed.user_ids.tolist() == list(reference['user'].unique())
  assert indexed.item_ids.tolist() == list(reference['item'].unique())


# leave_one_out_split

_TIES = [
    ('a', 'p', 5),  # row 0
    ('b', 'p', 3),  # row 1
    ('a', 'q', 5),  # row 2
    ('b', 'r', 2),  # row 3
    ('a', 'r', 1),  # row 4
    ('a', 's', 5),  # row 5
    ('b', 't', 1),  # row 6
]


def test_leave_one_out_takes_latest_and_second_latest_ties_by_row():
  # Items p=0 q=1 r=2 s=3 t=4. User a: r(1), then p (row 0), q (row 2) and
  # s (row 5) tied at 5: the first tied row in the file, p, is the test
  # item, the next, q, the validation item (the reference's
  # rank(method='first', ascending=False)). User b: t(1), r(2), p(3).
  data = preprocessing.leave_one_out_split(
      preprocessing.index_interactions(_frame(_TIES)), num_eval_negatives=0
  )

  np.testing.assert_array_equal(data.test_items, [0, 0])
  np.testing.assert_array_equal(data.val_items, [1, 2])
  assert _segments(data.train_offsets, data.train_items) == [[2, 3], [4]]
  assert _segments(data.interacted_offsets, data.interacted_items) == [
      [0, 1, 2, 3],
      [0, 2, 4],
  ]
  assert data.val_negatives.shape == data.test_negatives.shape == (2, 0)
  assert data.user_ids.tolist() == ['a', 'b']
  assert data.train_offsets.dtype == np.int64
  assert data.interacted_offsets.dtype == np.int64
  for array in (
      data.train_items,
      data.interacted_items,
      data.val_items,
      data.test_items,
      data.val_negatives,
      data.test_negatives,
  ):
    assert array.dtype == np.int32


def test_leave_one_out_rejects_users_with_fewer_than_three():
  indexed = preprocessing.index_interactions(
      _frame([
          ('a', 'x', 1),
          ('a', 'y', 2),
          ('a', 'z', 3),
          ('1m_7', 'x', 1),
          ('1m_7', 'y', 2),
      ])
  )

  with pytest.raises(
      errors.DataFormatError,
      match=r"user '1m_7' has 2 .*--min_interactions=3",
  ):
    preprocessing.leave_one_out_split(indexed, num_eval_negatives=0)


def test_leave_one_out_holds_out_what_the_reference_ranking_holds_out():
  # The PFedRec / NCF reference code: rank each user's rows by timestamp,
  # descending, ties in file order; rank 1 is the test item, 2 validation.
  rng = np.random.default_rng(3)
  rows = 600
  frame = pd.DataFrame({
      'user': [f'u{u}' for u in rng.integers(0, 40, rows)],
      'item': [f'i{i}' for i in rng.permutation(rows)],  # no repeated pair
      'rating': np.ones(rows),
      'timestamp': rng.integers(0, 4, rows).astype(float),  # many ties
  })
  frame = frame[frame.groupby('user')['user'].transform('size') >= 3]
  rank = frame.groupby('user')['timestamp'].rank(
      method='first', ascending=False)
  expected_test = frame[rank == 1].set_index('user')['item']
  expected_val = frame[rank == 2].set_index('user')['item']

  data = preprocessing.leave_one_out_split(
      preprocessing.index_interactions(frame.reset_index(drop=True)),
      num_eval_negatives=0,
  )

  users = data.user_ids.tolist()
  assert data.item_ids[data.test_items].tolist() == [
      expected_test[u] for u in users]
  assert data.item_ids[data.val_items].tolist() == [
      expected_val[u] for u in users]
  # The last-row rule disagrees on this data: the test is not vacuous.
  last = frame.groupby('user').apply(
      lambda rows: rows.sort_values('timestamp', kind='stable')['item']
      .iloc[-1])
  assert any(last[u] != expected_test[u] for u in users)


def test_leave_one_out_rejects_users_without_enough_negatives():
  # User a interacted with 4 of the 5 items; 2 * 1 negatives are needed.
  with pytest.raises(
      errors.DataFormatError,
      match=r"user 'a' interacted with 4 of 5 items, "
      r'leaving 1 .* 2 x 1 distinct .* at most 0',
  ):
    preprocessing.leave_one_out_split(
        preprocessing.index_interactions(_frame(_TIES)), num_eval_negatives=1
    )


def _random_leave_one_out(seed=0, num_eval_negatives=20):
  frame = synthetic.generate_interactions(num_users=300, num_items=200, seed=1)
  return preprocessing.leave_one_out_split(
      preprocessing.index_interactions(frame),
      num_eval_negatives=num_eval_negatives,
      seed=seed,
  )


def test_eval_negatives_are_distinct_never_interacted_and_disjoint():
  data = _random_leave_one_out()

  assert data.val_negatives.shape == data.test_negatives.shape == (300, 20)
  for u in range(data.num_users):
    interacted = set(
        data.interacted_items[
            data.interacted_offsets[u] : data.interacted_offsets[u + 1]
        ]
    )
    val, test = set(data.val_negatives[u]), set(data.test_negatives[u])
    assert len(val) == len(test) == 20
    assert not val & test
    assert not (val | test) & interacted
    assert {data.val_items[u], data.test_items[u]} <= interacted


def test_eval_negatives_are_deterministic_under_the_seed():
  first, again, other = (_random_leave_one_out(seed=s) for s in (0, 0, 1))

  np.testing.assert_array_equal(first.val_negatives, again.val_negatives)
  np.testing.assert_array_equal(first.test_negatives, again.test_negatives)
  assert not np.array_equal(first.test_negatives, other.test_negatives)
  # The split itself does not depend on the seed.
  np.testing.assert_array_equal(first.test_items, other.test_items)


def test_eval_negatives_exhaust_an_exact_complement():
  # 12 items, user 0 holds 4, so its 2 * 4 negatives are exactly the rest.
  indexed = _indexed_from_lists([[0, 3, 6, 9], [0, 1, 2]], num_items=12)

  data = preprocessing.leave_one_out_split(indexed, num_eval_negatives=4)

  negatives = np.concatenate([data.val_negatives[0], data.test_negatives[0]])
  assert sorted(negatives) == [1, 2, 4, 5, 7, 8, 10, 11]


def test_eval_negatives_are_uniform_in_both_halves():
  # 3000 identical users hold items 0..2 of 10; each of the 7 free items
  # should fill a given slot 3000 / 7 ~ 429 times (sd ~ 19).
  indexed = _indexed_from_lists([[0, 1, 2]] * 3000, num_items=10)

  data = preprocessing.leave_one_out_split(indexed, num_eval_negatives=2)

  for negatives in (data.val_negatives, data.test_negatives):
    for slot in range(2):
      counts = np.bincount(negatives[:, slot], minlength=10)
      np.testing.assert_array_equal(counts[:3], 0)
      assert np.all(np.abs(counts[3:] - 3000 / 7) < 100), counts


# random_split


def test_random_split_sizes_and_partition():
  # n = 2, 5, 10, 3 -> round(0.8 n) = 2 (clipped to 1), 4, 8, 2.
  lists = [[0, 1], [2, 3, 4, 5, 6], list(range(10)), [7, 8, 9]]
  indexed = _indexed_from_lists(lists, num_items=10)

  data = preprocessing.random_split(indexed, train_fraction=0.8, seed=0)

  np.testing.assert_array_equal(np.diff(data.train_offsets), [1, 4, 8, 2])
  np.testing.assert_array_equal(np.diff(data.test_offsets), [1, 1, 2, 1])
  train = _segments(data.train_offsets, data.train_items)
  test = _segments(data.test_offsets, data.test_items)
  for u, items in enumerate(lists):
    assert sorted(train[u] + test[u]) == sorted(items)
    # Time order (here: list order) is kept within each part.
    assert train[u] == [i for i in items if i in train[u]]
  assert _segments(data.interacted_offsets, data.interacted_items) == [
      sorted(x) for x in lists
  ]


def test_random_split_is_seeded_and_uniform():
  indexed = _indexed_from_lists([[0, 1, 2, 3, 4]] * 2000, num_items=5)

  first = preprocessing.random_split(indexed, seed=3)
  again = preprocessing.random_split(indexed, seed=3)
  other = preprocessing.random_split(indexed, seed=4)

  np.testing.assert_array_equal(first.test_items, again.test_items)
  assert not np.array_equal(first.test_items, other.test_items)
  # One test item per user, each of the 5 items ~400 times (sd ~ 18).
  counts = np.bincount(first.test_items, minlength=5)
  assert np.all(np.abs(counts - 400) < 80), counts


def test_random_split_rejects_users_with_one_interaction():
  indexed = preprocessing.index_interactions(
      _frame([('a', 'x', 1), ('a', 'y', 2), ('lonely', 'x', 3)])
  )

  with pytest.raises(
      errors.DataFormatError,
      match=r"user 'lonely' has 1 .*--min_interactions=2",
  ):
    preprocessing.random_split(indexed)


# sample_training_examples


def _examples(data, rng, negatives_per_positive=4):
  return preprocessing.sample_training_examples(
      train_offsets=data.train_offsets,
      train_items=data.train_items,
      interacted_offsets=data.interacted_offsets,
      interacted_items=data.interacted_items,
      num_items=data.num_items,
      negatives_per_positive=negatives_per_positive,
      rng=rng,
  )


def test_training_examples_on_a_hand_built_case():
  # User 0: positives 0, 1 and also interacted with 2; user 1: positive 3,
  # interacted with 4; user 2: no positives. 6 items, k = 2.
  examples = preprocessing.sample_training_examples(
      train_offsets=np.array([0, 2, 3, 3]),
      train_items=np.array([0, 1, 3]),
      interacted_offsets=np.array([0, 3, 5, 6]),
      interacted_items=np.array([0, 1, 2, 3, 4, 5]),
      num_items=6,
      negatives_per_positive=2,
      rng=np.random.default_rng(0),
  )

  np.testing.assert_array_equal(examples.offsets, [0, 6, 9, 9])
  assert examples.offsets.dtype == np.int64
  assert examples.items.dtype == np.int32
  assert examples.labels.dtype == np.float32
  items, labels = preprocessing.user_examples(examples, 0)
  assert sorted(items[labels == 1]) == [0, 1]
  assert set(items[labels == 0]) <= {3, 4, 5}
  assert np.sum(labels == 0) == 4
  items, labels = preprocessing.user_examples(examples, 1)
  assert items[labels == 1].tolist() == [3]
  assert set(items[labels == 0]) <= {0, 1, 2, 5}
  assert np.sum(labels == 0) == 2
  assert preprocessing.user_examples(examples, 2)[0].size == 0


def test_training_examples_counts_labels_and_exclusions():
  data = _random_leave_one_out()
  examples = _examples(data, np.random.default_rng(0))

  positives = np.diff(data.train_offsets)
  np.testing.assert_array_equal(np.diff(examples.offsets), 5 * positives)
  for u in range(data.num_users):
    items, labels = preprocessing.user_examples(examples, u)
    train = data.train_items[data.train_offsets[u] : data.train_offsets[u + 1]]
    interacted = data.interacted_items[
        data.interacted_offsets[u] : data.interacted_offsets[u + 1]
    ]
    assert set(np.unique(labels)) == {0.0, 1.0}
    # Shuffling keeps the multiset of positives.
    assert sorted(items[labels == 1]) == sorted(train)
    assert not np.isin(items[labels == 0], interacted).any()


def test_training_examples_are_redrawn_and_shuffled_but_seeded():
  data = _random_leave_one_out()
  rng = np.random.default_rng(5)
  first, second = _examples(data, rng), _examples(data, rng)
  replay = _examples(data, np.random.default_rng(5))

  np.testing.assert_array_equal(first.items, replay.items)
  np.testing.assert_array_equal(first.labels, replay.labels)
  assert not np.array_equal(first.items, second.items)
  # Positives land all over their segments, not only at the front: over
  # all users the mean relative position of a positive is ~ 1/2.
  positions = np.arange(first.items.size) - np.repeat(
      first.offsets[:-1], np.diff(first.offsets)
  )
  relative = positions / np.repeat(
      np.diff(first.offsets), np.diff(first.offsets)
  )
  assert abs(relative[first.labels == 1].mean() - 0.5) < 0.05


def test_training_negatives_are_uniform_over_the_complement():
  # One user holding items 0..2 of 10 with 3 positives and k = 1000: each
  # of the 7 free items should appear 3000 / 7 ~ 429 times (sd ~ 19).
  examples = preprocessing.sample_training_examples(
      train_offsets=np.array([0, 3]),
      train_items=np.array([0, 1, 2]),
      interacted_offsets=np.array([0, 3]),
      interacted_items=np.array([0, 1, 2]),
      num_items=10,
      negatives_per_positive=1000,
      rng=np.random.default_rng(0),
  )

  counts = np.bincount(examples.items[examples.labels == 0], minlength=10)
  np.testing.assert_array_equal(counts[:3], 0)
  assert np.all(np.abs(counts[3:] - 3000 / 7) < 100), counts


def test_rank_to_item_mapping_matches_brute_force():
  rng = np.random.default_rng(0)
  num_items = 30
  lists = [
      np.sort(rng.choice(num_items, size=n, replace=False))
      for n in (0, 1, 5, 29, 12)
  ]
  offsets = np.concatenate([[0], np.cumsum([len(x) for x in lists])])
  items = np.concatenate(lists).astype(np.int32)
  keys = preprocessing._free_rank_keys(offsets, items, num_items)
  for u, held in enumerate(lists):
    free = [i for i in range(num_items) if i not in held]
    mapped = preprocessing._never_interacted_items(
        keys, offsets, num_items, np.full(len(free), u), np.arange(len(free))
    )
    assert mapped.tolist() == free


def test_training_examples_reject_a_user_with_no_free_item():
  with pytest.raises(ValueError, match='user 1 interacted with all 3'):
    preprocessing.sample_training_examples(
        train_offsets=np.array([0, 1, 2]),
        train_items=np.array([0, 2]),
        interacted_offsets=np.array([0, 1, 4]),
        interacted_items=np.array([0, 0, 1, 2]),
        num_items=3,
        rng=np.random.default_rng(0),
    )


def test_training_examples_at_ml1m_size_are_complete_and_never_interacted():
  # ~1M positives over 6040 users and 3706 items, as in ML-1M. How long
  # sampling takes is measured by programs/data_benchmark.py.
  num_users, num_items = 6040, 3706
  arrays = synthetic.generate_interaction_arrays(
      num_users=num_users, num_items=num_items, mean_interactions_per_user=165
  )
  order = np.lexsort((arrays.item_index, arrays.user_index))
  counts = np.bincount(arrays.user_index, minlength=num_users)
  offsets = np.concatenate([[0], np.cumsum(counts)])
  items = arrays.item_index[order]
  assert items.size > 900_000

  examples = preprocessing.sample_training_examples(
      train_offsets=offsets,
      train_items=items,
      interacted_offsets=offsets,
      interacted_items=items,
      num_items=num_items,
      rng=np.random.default_rng(0),
  )

  np.testing.assert_array_equal(np.diff(examples.offsets), 5 * counts)
  # Keys user * I + item, ascending like the per-user sorted items.
  interacted = np.repeat(np.arange(num_users), counts) * num_items + items
  example_keys = (
      np.repeat(np.arange(num_users), 5 * counts) * num_items + examples.items
  )
  is_positive = examples.labels == 1
  np.testing.assert_array_equal(np.sort(example_keys[is_positive]), interacted)
  assert not np.isin(example_keys[~is_positive], interacted).any()


def test_distinct_negatives_per_positive_are_a_uniform_subset():
  # 200 users, one positive each, items 0..4 interacted, 5 of 10 free, k=4:
  # with replacement a user's 4 draws repeat with probability 0.81; as
  # PFedRec's random.sample, never. Each free item is in 4 / 5 of them.
  users = 200
  interacted = np.tile(np.arange(5), users)
  examples = preprocessing.sample_training_examples(
      train_offsets=np.arange(users + 1),
      train_items=np.zeros(users, np.int32),
      interacted_offsets=np.arange(0, 5 * users + 1, 5),
      interacted_items=interacted,
      num_items=10,
      negatives_per_positive=4,
      rng=np.random.default_rng(1),
      distinct_per_positive=True,
  )
  counts = np.zeros(10)
  for u in range(users):
    items, labels = preprocessing.user_examples(examples, u)
    negatives = items[labels == 0]
    assert len(set(negatives.tolist())) == 4
    assert negatives.min() >= 5
    counts[negatives] += 1
  # Binomial(200, 0.8): sd 5.7.
  assert np.all(np.abs(counts[5:] - 160) < 25), counts
  # A user with fewer free items than k draws with replacement.
  few = preprocessing.sample_training_examples(
      train_offsets=np.array([0, 1]), train_items=np.array([0]),
      interacted_offsets=np.array([0, 7]), interacted_items=np.arange(7),
      num_items=10, negatives_per_positive=4,
      rng=np.random.default_rng(0), distinct_per_positive=True,
  )
  assert set(few.items[few.labels == 0].tolist()) <= {7, 8, 9}


def test_distinct_items_per_user_against_python_sets():
  rng = np.random.default_rng(3)
  counts = np.array([5, 0, 9, 1, 7])
  offsets = np.concatenate([[0], np.cumsum(counts)])
  items = rng.integers(0, 6, counts.sum())  # Repeats within users.

  got_offsets, got_items = preprocessing.distinct_items_per_user(
      offsets, items, num_items=6)

  assert got_offsets.shape == (counts.size + 1,)
  for user in range(counts.size):
    expected = sorted(set(items[offsets[user]:offsets[user + 1]].tolist()))
    assert got_items[got_offsets[user]:got_offsets[user + 1]].tolist() == (
        expected)
