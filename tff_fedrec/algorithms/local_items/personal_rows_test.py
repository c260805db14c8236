"""The local-item methods' store: personal rows, start tables and own
tables (`personal_rows`)."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec.algorithms.local_items import personal_rows

_DIM = 2
_NUM_ITEMS = 5
_NUM_USERS = 4


def _initial_state(dim=_DIM):
  """A score-function client state (as client_training makes it), by hand."""
  return collections.OrderedDict(
      local_parameters=collections.OrderedDict(
          score_layers=[
              collections.OrderedDict(
                  kernel=np.full([dim, 1], 0.5, np.float32),
                  bias=np.array([-1.0], np.float32),
              )
          ]
      ),
      personal_item_ids=np.zeros([0], np.int32),
      personal_item_rows=np.zeros([0, dim], np.float32),
  )


def _state(user, personal_ids):
  """A distinct state for `user` with personal rows for `personal_ids`."""
  ids = np.asarray(personal_ids, np.int32)
  return collections.OrderedDict(
      local_parameters=collections.OrderedDict(
          score_layers=[
              collections.OrderedDict(
                  kernel=np.full([_DIM, 1], 10.0 * user, np.float32),
                  bias=np.array([user], np.float32),
              )
          ]
      ),
      personal_item_ids=ids,
      # Row of item i for this user: [100 * (user + 1) + i, -i].
      personal_item_rows=np.stack(
          [100.0 * (user + 1) + ids, -ids.astype(np.float32)], axis=1
      ).astype(np.float32).reshape([-1, _DIM]),
  )


def _global_item_embedding():
  return np.arange(_NUM_ITEMS * _DIM, dtype=np.float32).reshape(
      _NUM_ITEMS, _DIM
  )


def _assert_states_equal(got, expected):
  layer_got = got['local_parameters']['score_layers'][0]
  layer_expected = expected['local_parameters']['score_layers'][0]
  np.testing.assert_array_equal(layer_got['kernel'], layer_expected['kernel'])
  np.testing.assert_array_equal(layer_got['bias'], layer_expected['bias'])
  np.testing.assert_array_equal(
      got['personal_item_ids'], expected['personal_item_ids']
  )
  np.testing.assert_array_equal(
      got['personal_item_rows'], expected['personal_item_rows']
  )
  assert got['personal_item_rows'].shape == (
      len(expected['personal_item_ids']), _DIM
  )


def _filled_store():
  """Users 0 and 2 have personal rows, 1 and 3 (the last one) have none."""
  store = personal_rows.PersonalRowsStore(_NUM_USERS, _initial_state())
  store.put([2, 0, 1], [_state(2, [4, 0]), _state(0, [3, 1, 2]), _state(1, [])])
  return store


def test_fresh_store_holds_the_initial_state_for_everyone():
  store = personal_rows.PersonalRowsStore(_NUM_USERS, _initial_state())

  states = store.get(range(_NUM_USERS))

  assert store.num_users == _NUM_USERS
  assert len(states) == _NUM_USERS
  for state in states:
    _assert_states_equal(state, _initial_state())


def test_get_put_round_trip():
  store = _filled_store()

  got = store.get([3, 2, 0, 1])

  _assert_states_equal(got[0], _initial_state())
  _assert_states_equal(got[1], _state(2, [4, 0]))
  _assert_states_equal(got[2], _state(0, [3, 1, 2]))
  _assert_states_equal(got[3], _state(1, []))
  assert list(got[1]) == [
      'local_parameters', 'personal_item_ids', 'personal_item_rows'
  ]


def test_put_overwrites_only_the_given_users():
  store = _filled_store()

  store.put([0], [_state(5, [1])])

  _assert_states_equal(store.get([0])[0], _state(5, [1]))
  _assert_states_equal(store.get([2])[0], _state(2, [4, 0]))


def test_put_rejects_mismatched_lengths():
  store = personal_rows.PersonalRowsStore(_NUM_USERS, _initial_state())

  with pytest.raises(ValueError):
    store.put([0, 1], [_state(0, [])])


def test_item_vectors_prefers_personal_rows():
  store = _filled_store()
  item_embedding = _global_item_embedding()
  original = item_embedding.copy()
  users = np.array([0, 1, 2, 3])
  candidates = np.array([
      [1, 4, 3, 0],  # user 0 has 3, 1, 2: items 1 and 3 personal
      [1, 4, 3, 0],  # user 1 has none: all global
      [0, 0, 1, 4],  # user 2 has 4, 0: items 0 (twice) and 4 personal
      [2, 2, 2, 2],  # user 3 has none
  ])

  got = store.item_vectors(users, candidates, item_embedding)

  g = item_embedding
  def personal(user, item):
    return np.array([100.0 * (user + 1) + item, -item], np.float32)
  expected = np.array([
      [personal(0, 1), g[4], personal(0, 3), g[0]],
      [g[1], g[4], g[3], g[0]],
      [personal(2, 0), personal(2, 0), g[1], personal(2, 4)],
      [g[2], g[2], g[2], g[2]],
  ])
  np.testing.assert_array_equal(got, expected)
  assert got.dtype == np.float32
  # The global table is read, never written.
  np.testing.assert_array_equal(item_embedding, original)


def test_put_local_parameters_is_the_inverse_of_stacked_local_parameters():
  store = _filled_store()
  users = np.array([3, 0])
  stacked = store.stacked_local_parameters(users)
  stacked['score_layers'][0]['bias'] = np.array([[7.0], [8.0]], np.float32)
  before = store.get([0])[0]
  store.put_local_parameters(users, stacked)
  np.testing.assert_array_equal(
      store.stacked_local_parameters(np.array([0, 3]))['score_layers'][0][
          'bias'
      ],
      [[8.0], [7.0]],
  )
  # Personal rows and the kernels are untouched.
  after = store.get([0])[0]
  np.testing.assert_array_equal(
      after['personal_item_rows'], before['personal_item_rows']
  )
  np.testing.assert_array_equal(
      after['local_parameters']['score_layers'][0]['kernel'],
      before['local_parameters']['score_layers'][0]['kernel'],
  )


def test_item_vectors_follow_later_puts_and_loads():
  # Every put and load_arrays is visible to the next call (an earlier
  # version cached an index of the rows).
  store = _filled_store()
  item_embedding = _global_item_embedding()
  users = np.array([1])
  candidates = np.array([[2, 3]])
  np.testing.assert_array_equal(
      store.item_vectors(users, candidates, item_embedding)[0],
      item_embedding[[2, 3]],
  )
  store.put([1], [_state(1, [3])])
  np.testing.assert_array_equal(
      store.item_vectors(users, candidates, item_embedding)[0],
      [item_embedding[2], [203.0, -3.0]],
  )
  snapshot = store.to_arrays()
  store.put([1], [_state(1, [])])
  np.testing.assert_array_equal(
      store.item_vectors(users, candidates, item_embedding)[0],
      item_embedding[[2, 3]],
  )
  store.load_arrays(snapshot)
  np.testing.assert_array_equal(
      store.item_vectors(users, candidates, item_embedding)[0],
      [item_embedding[2], [203.0, -3.0]],
  )


def test_item_vectors_for_a_subset_of_users_in_any_order():
  store = _filled_store()
  item_embedding = _global_item_embedding()

  got = store.item_vectors(
      np.array([2, 0]), np.array([[4, 1], [4, 1]]), item_embedding
  )

  # Row 0 is user 2 (personal 4, global 1), row 1 user 0 (global 4,
  # personal 1).
  expected = np.array([
      [[300.0 + 4, -4.0], item_embedding[1]],
      [item_embedding[4], [100.0 + 1, -1.0]],
  ])
  np.testing.assert_array_equal(got, expected)


def test_a_duplicated_personal_id_is_read_from_its_first_row():
  store = personal_rows.PersonalRowsStore(_NUM_USERS, _initial_state())
  state = _state(1, [4, 2, 4])
  state['personal_item_rows'][2] = [-9.0, -9.0]
  store.put([1], [state])

  got = store.item_vectors(
      np.array([1]), np.array([[4, 2, 0]]), _global_item_embedding())

  np.testing.assert_array_equal(
      got[0], [[204.0, -4.0], [202.0, -2.0], _global_item_embedding()[0]])


def test_item_vectors_without_personal_rows_are_global_rows():
  store = personal_rows.PersonalRowsStore(_NUM_USERS, _initial_state())
  item_embedding = _global_item_embedding()
  candidates = np.array([[0, 4], [3, 3], [1, 2]])

  got = store.item_vectors(np.array([0, 1, 3]), candidates, item_embedding)

  np.testing.assert_array_equal(got, item_embedding[candidates])


def test_stacked_local_parameters():
  store = _filled_store()

  stacked = store.stacked_local_parameters(np.array([2, 3, 0]))

  layer = stacked['score_layers'][0]
  assert layer['kernel'].shape == (3, _DIM, 1)
  assert layer['bias'].shape == (3, 1)
  # Users 2 and 0 as put, user 3 still initial (kernel 0.5, bias -1).
  np.testing.assert_array_equal(layer['kernel'][:, 0, 0], [20.0, 0.5, 0.0])
  np.testing.assert_array_equal(layer['bias'][:, 0], [2.0, -1.0, 0.0])


def test_bytes_per_user():
  store = _filled_store()

  # Local parameters, float32: kernel d x 1 + bias 1 = 3 floats = 12 bytes for
  # every user. Personal: user 0 has 3 ids (int32) and 3 rows of d floats,
  # user 2 has 2, users 1 and 3 none: (3 + 2) * (4 + 4 d) = 60 bytes in all.
  expected = (_NUM_USERS * 4 * (_DIM + 1) + 5 * (4 + 4 * _DIM)) / _NUM_USERS

  assert store.bytes_per_user() == pytest.approx(expected)


def _table(value):
  return np.full([_NUM_ITEMS, _DIM], value, np.float32) + np.arange(
      _NUM_ITEMS, dtype=np.float32)[:, None]


def test_untrained_rows_come_from_the_table_each_user_last_started_from():
  # PFedRec's reference code keeps each client's whole table after its
  # round: its fine-tuned rows over the table broadcast at that round's
  # start. Users 0 and 2 start round 3 from table A, user 1 starts round 5
  # from table B, user 3 never trained (the global table scores it).
  store = _filled_store()
  table_a, table_b, global_table = _table(1000.0), _table(2000.0), _table(0.0)
  store.record_start_table(np.array([0, 2]), 3, table_a)
  store.record_start_table(np.array([1]), 5, table_b)
  users = np.array([0, 1, 2, 3])
  candidates = np.tile(np.arange(_NUM_ITEMS), (_NUM_USERS, 1))

  got = store.item_vectors(users, candidates, global_table)

  personal = {0: [3, 1, 2], 2: [4, 0], 1: [], 3: []}
  start = {0: table_a, 1: table_b, 2: table_a, 3: global_table}
  for row, user in enumerate(users):
    for column, item in enumerate(candidates[row]):
      if item in personal[user]:
        expected = [100.0 * (user + 1) + item, -item]
      else:
        expected = start[user][item]
      np.testing.assert_array_equal(got[row, column], expected)
  assert store.num_start_tables == 2


def test_start_tables_no_user_refers_to_are_dropped():
  store = _filled_store()
  store.record_start_table(np.array([0, 1]), 0, _table(1.0))
  store.record_start_table(np.array([0]), 1, _table(2.0))
  assert store.num_start_tables == 2  # User 1 still started from round 0.
  store.record_start_table(np.array([1, 2, 3]), 2, _table(3.0))
  assert store.num_start_tables == 2  # Rounds 1 (user 0) and 2.
  store.record_start_table(np.array([0, 1, 2, 3]), 3, _table(4.0))
  assert store.num_start_tables == 1
  candidates = np.tile(np.arange(_NUM_ITEMS), (_NUM_USERS, 1))
  np.testing.assert_array_equal(
      store.item_vectors(np.array([3]), candidates[:1], _table(0.0))[0],
      _table(4.0),
  )


@pytest.mark.parametrize('seed', range(4))
def test_kept_start_tables_are_the_rounds_some_user_last_started_from(seed):
  # Reference: the last round each user started, replayed in plain Python;
  # random rounds of random (repeating) users, with a checkpoint half way.
  rng = np.random.default_rng(seed)
  num_users = 12
  store = personal_rows.PersonalRowsStore(
      num_users, _initial_state())
  last_start = {}
  for round_num in range(30):
    users = rng.choice(num_users, size=rng.integers(0, 6))
    store.record_start_table(users, round_num, _table(float(round_num)))
    last_start.update({int(u): round_num for u in users})
    if round_num == 15:
      restored = personal_rows.PersonalRowsStore(
          num_users, _initial_state())
      restored.load_arrays(store.to_arrays())
      store = restored
    assert store.num_start_tables == len(set(last_start.values()))
  candidates = np.tile(np.arange(_NUM_ITEMS), (num_users, 1))
  got = store.item_vectors(np.arange(num_users), candidates, _table(-1.0))
  for user in range(num_users):
    np.testing.assert_array_equal(
        got[user], _table(float(last_start.get(user, -1.0))))


def test_given_start_vectors_replace_the_tables_under_personal_rows():
  store = _filled_store()
  store.record_start_table(np.array([0]), 0, _table(1.0))
  candidates = np.array([[1, 4, 3, 0]])
  start = np.full([1, 4, _DIM], -7.0, np.float32)

  got = store.item_vectors(np.array([0]), candidates, _table(0.0),
                           start_vectors=start)

  # User 0's personal rows are items 3, 1, 2.
  np.testing.assert_array_equal(got[0, 1], [-7.0, -7.0])
  np.testing.assert_array_equal(got[0, 3], [-7.0, -7.0])
  np.testing.assert_array_equal(got[0, 0], [101.0, -1.0])
  np.testing.assert_array_equal(got[0, 2], [103.0, -3.0])


def test_start_tables_survive_a_checkpoint_and_count_in_the_bytes():
  store = _filled_store()
  before = store.bytes_per_user()
  store.record_start_table(np.array([0, 2]), 3, _table(1000.0))
  store.record_start_table(np.array([1]), 5, _table(2000.0))
  restored = personal_rows.PersonalRowsStore(_NUM_USERS, _initial_state())

  restored.load_arrays(store.to_arrays())

  candidates = np.tile(np.arange(_NUM_ITEMS), (_NUM_USERS, 1))
  users = np.arange(_NUM_USERS)
  np.testing.assert_array_equal(
      restored.item_vectors(users, candidates, _table(0.0)),
      store.item_vectors(users, candidates, _table(0.0)),
  )
  # Two [N, d] float32 tables and one int64 round per user.
  assert store.bytes_per_user() == pytest.approx(
      before + (2 * _NUM_ITEMS * _DIM * 4 + 8 * _NUM_USERS) / _NUM_USERS)


def test_to_arrays_load_arrays_round_trip():
  store = _filled_store()
  arrays = store.to_arrays()
  restored = personal_rows.PersonalRowsStore(_NUM_USERS, _initial_state())

  restored.load_arrays(arrays)

  users = list(range(_NUM_USERS))
  for got, expected in zip(restored.get(users), store.get(users)):
    _assert_states_equal(got, expected)
  candidates = np.tile(np.arange(_NUM_ITEMS), (_NUM_USERS, 1))
  np.testing.assert_array_equal(
      restored.item_vectors(np.array(users), candidates,
                            _global_item_embedding()),
      store.item_vectors(np.array(users), candidates, _global_item_embedding()),
  )
  # CSR layout: user 0 has 3 rows, 1 none, 2 two, 3 none.
  ragged = arrays['ragged']
  np.testing.assert_array_equal(
      ragged['personal_item_ids']['offsets'], [0, 3, 3, 5, 5])
  assert ragged['personal_item_rows']['values'].shape == (5, _DIM)


def test_round_trip_when_nobody_has_personal_rows():
  store = personal_rows.PersonalRowsStore(_NUM_USERS, _initial_state())
  store.put([1], [_state(1, [])])
  restored = personal_rows.PersonalRowsStore(_NUM_USERS, _initial_state())

  arrays = store.to_arrays()
  restored.load_arrays(arrays)

  assert arrays['ragged']['personal_item_ids']['values'].shape == (0,)
  assert arrays['ragged']['personal_item_rows']['values'].shape == (0, _DIM)
  for user in range(_NUM_USERS):
    _assert_states_equal(restored.get([user])[0], store.get([user])[0])


def test_loaded_store_is_independent_of_the_arrays():
  store = _filled_store()
  arrays = store.to_arrays()
  restored = personal_rows.PersonalRowsStore(_NUM_USERS, _initial_state())
  restored.load_arrays(arrays)
  snapshot = [leaf.copy() for leaf in arrays['local_leaves']]

  restored.put([3], [_state(9, [])])

  for leaf, before in zip(arrays['local_leaves'], snapshot):
    np.testing.assert_array_equal(leaf, before)
  _assert_states_equal(store.get([3])[0], _initial_state())
  _assert_states_equal(restored.get([3])[0], _state(9, []))


@pytest.mark.parametrize(
    'num_users,dim', [(_NUM_USERS + 1, _DIM), (_NUM_USERS, 3)]
)
def test_load_arrays_rejects_other_shapes(num_users, dim):
  other = personal_rows.PersonalRowsStore(num_users, _initial_state(dim))
  store = personal_rows.PersonalRowsStore(_NUM_USERS, _initial_state())

  with pytest.raises(ValueError, match='do not match'):
    store.load_arrays(other.to_arrays())


def test_put_group_keeps_each_users_real_rows():
  store = personal_rows.PersonalRowsStore(_NUM_USERS, _initial_state())
  group_state = collections.OrderedDict(
      local_parameters=collections.OrderedDict(score_layers=[
          collections.OrderedDict(
              kernel=np.stack([np.full([_DIM, 1], 5.0, np.float32),
                               np.full([_DIM, 1], 7.0, np.float32)]),
              bias=np.array([[5.0], [7.0]], np.float32),
          )
      ]),
      personal_item_ids=np.array([[3, 1, 4], [2, 0, 0]], np.int32),
      personal_item_rows=np.arange(12, dtype=np.float32).reshape([2, 3, 2]),
  )

  # Users 3 and 0, with 3 and 1 real rows; the rest of row 1 is padding.
  store.put_group(np.array([3, 0]), group_state,
                  {'num_rows': np.array([3, 1])})

  got_3, got_0 = store.get([3, 0])
  assert got_3['local_parameters']['score_layers'][0]['bias'][0] == 5.0
  assert got_0['local_parameters']['score_layers'][0]['bias'][0] == 7.0
  np.testing.assert_array_equal(got_3['personal_item_ids'], [3, 1, 4])
  np.testing.assert_array_equal(got_0['personal_item_ids'], [2])
  np.testing.assert_array_equal(got_0['personal_item_rows'], [[6.0, 7.0]])
  _assert_states_equal(store.get([1])[0], _initial_state())


def _own_table_store():
  """Three users of a 6-item table of width 2, rows i = [i, 10 i]."""
  table = np.stack([np.arange(6), 10 * np.arange(6)], 1).astype(np.float32)
  initial = collections.OrderedDict(
      local_parameters=collections.OrderedDict(
          user=np.zeros([2], np.float32)),
      personal_item_ids=np.zeros([0], np.int32),
      personal_item_rows=np.zeros([0, 2], np.float32),
  )
  return personal_rows.OwnTableStore(3, initial, table), table


def _round_state(ids, rows):
  """A group's round as the client work returns it, padded with 99s."""
  width = max(len(i) for i in ids)
  padded_ids = np.zeros([len(ids), width], np.int32)
  padded_rows = np.full([len(ids), width, 2], 99.0, np.float32)
  for u, (user_ids, user_rows) in enumerate(zip(ids, rows)):
    padded_ids[u, : len(user_ids)] = user_ids
    padded_rows[u, : len(user_ids)] = user_rows
  return collections.OrderedDict(
      local_parameters=collections.OrderedDict(
          user=np.ones([len(ids), 2], np.float32)),
      personal_item_ids=padded_ids, personal_item_rows=padded_rows,
  ), np.array([len(i) for i in ids])


def test_own_tables_merge_rounds_over_the_initial_table():
  store, table = _own_table_store()
  # Round 1: user 0 trains items 1 and 4, user 2 item 5.
  state, counts = _round_state([[1, 4], [5]],
                               [np.full([2, 2], -1.0), np.full([1, 2], -2.0)])
  store.put_group(np.array([0, 2]), state, {'num_rows': counts})
  # Round 2: user 0 trains items 0 and 4: item 4's row is replaced, item 1's
  # kept as it was.
  state, counts = _round_state([[0, 4]], [np.full([2, 2], -3.0)])
  store.put_group(np.array([0]), state, {'num_rows': counts})

  vectors = store.table_vectors(np.arange(3), np.tile(np.arange(6), [3, 1]))
  expected = np.repeat(table[None], 3, axis=0)
  expected[0, [0, 4]] = -3.0
  expected[0, 1] = -1.0
  expected[2, 5] = -2.0
  np.testing.assert_array_equal(vectors, expected)
  (user0,) = store.get([0])
  np.testing.assert_array_equal(user0['personal_item_ids'], [0, 1, 4])
  # The item vectors of scoring read the same rows over any base table.
  np.testing.assert_array_equal(
      store.item_vectors(np.array([0]), np.arange(6)[None], table)[0],
      expected[0])

  restored, _ = _own_table_store()
  restored.load_arrays(store.to_arrays())
  np.testing.assert_array_equal(
      restored.table_vectors(np.arange(3), np.tile(np.arange(6), [3, 1])),
      vectors)
  assert restored.bytes_per_user() == store.bytes_per_user()


def test_kept_rows_are_the_positions_of_the_scored_items():
  rng = np.random.default_rng(4)
  row_ids, counts, scored = [], [], []
  for user in range(5):
    ids = np.sort(rng.choice(30, rng.integers(1, 9), replace=False))
    row_ids.append(np.pad(ids, (0, 8 - ids.size)))
    counts.append(ids.size)
    scored.append(None if user == 3 else
                  np.array([], np.int64) if user == 4 else
                  np.sort(rng.choice(30, 12, replace=False)))
  row_ids = np.stack(row_ids).astype(np.int32)

  got = personal_rows.kept_rows(row_ids, np.array(counts), scored)

  for user, (ids, count, items) in enumerate(zip(row_ids, counts, scored)):
    expected = (np.arange(count) if items is None
                else np.flatnonzero(np.isin(ids[:count], items)))
    n = got['num_kept_rows'][user]
    assert n == expected.size
    np.testing.assert_array_equal(got['kept_rows'][user, :n], expected)
    assert not got['kept_rows'][user, n:].any()
  assert got['kept_rows'].shape[1] == got['num_kept_rows'].max()
  # Padding ids (0) are never kept, even when item 0 is scored.
  padded = personal_rows.kept_rows(np.array([[5, 0, 0]], np.int32),
                                   np.array([1]), [np.array([0, 5])])
  np.testing.assert_array_equal(padded['num_kept_rows'], [1])


def test_a_group_keeping_fewer_rows_than_it_trained_marks_its_users():
  store = personal_rows.PersonalRowsStore(_NUM_USERS, _initial_state())
  state = _state(0, [1, 3])
  group_state = collections.OrderedDict(
      local_parameters=tf.nest.map_structure(
          lambda leaf: np.stack([leaf, leaf]), state['local_parameters']),
      personal_item_ids=np.array([[1, 3], [2, 0]], np.int32),
      personal_item_rows=np.zeros([2, 2, _DIM], np.float32),
  )
  # User 2 trained 4 rows and kept 2; user 1 kept the 1 it trained.
  store.put_group(np.array([2, 1]), group_state, {
      'num_rows': np.array([4, 1]), 'num_kept_rows': np.array([2, 1])})
  np.testing.assert_array_equal(store.has_whole_rows(range(_NUM_USERS)),
                                [True, True, False, True])
  np.testing.assert_array_equal(store.get([2])[0]['personal_item_ids'],
                                [1, 3])
  # A store whose users train from their rows refuses to lose any.
  own, _ = _own_table_store()
  state, counts = _round_state([[1, 4]], [np.full([2, 2], -1.0)])
  with pytest.raises(ValueError, match='keep every row they trained'):
    own.put_group(np.array([0]), state, {
        'num_rows': counts, 'num_kept_rows': counts - 1})
