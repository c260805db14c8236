"""The generic client-state store: partitions of stacked state, ragged
fields, and their checkpoint arrays, against plain per-user dicts."""

import tracemalloc

import numpy as np
import pytest

from tff_fedrec import client_state_store


def _partitioned_store(ragged=None):
  """Users 0 and 3 keep 2-wide states, users 1 and 2 3-wide ones (two
  partitions, as tiers of different model sizes)."""
  return client_state_store.ClientStateStore.from_partitions(4, [
      (np.array([0, 3]), {'w': np.array([[0, 0], [3, 3]], np.float32)}),
      (np.array([2, 1]), {'w': np.array([[2, 2, 2], [1, 1, 1]], np.float32)}),
  ], ragged=ragged)


def test_one_partition_starts_every_user_at_the_initial_state():
  store = client_state_store.ClientStateStore(
      3, {'a': np.array([1.0, 2.0], np.float32), 'b': np.float32(5.0)})
  stacked = store.stacked_local_parameters(np.array([2, 0]))
  np.testing.assert_array_equal(stacked['a'], [[1, 2], [1, 2]])
  np.testing.assert_array_equal(stacked['b'], [5, 5])
  # A user's own copy: writing one leaves the others.
  store.put_local_parameters(
      np.array([1]), {'a': np.array([[7.0, 8.0]]), 'b': np.array([9.0])})
  np.testing.assert_array_equal(store.local_parameters([1])[0]['a'], [7, 8])
  np.testing.assert_array_equal(store.local_parameters([0])[0]['a'], [1, 2])
  assert store.num_users == 3 and store.ragged_fields == ()


def test_partitions_keep_their_own_shapes():
  store = _partitioned_store()

  np.testing.assert_array_equal(
      store.stacked_local_parameters(np.array([3, 0]))['w'], [[3, 3], [0, 0]])
  np.testing.assert_array_equal(
      store.stacked_local_parameters(np.array([1, 2]))['w'],
      [[1, 1, 1], [2, 2, 2]])
  # A round's group returns its stacked state (the default put_group).
  store.put_group(np.array([1]), {'w': np.array([[9, 9, 9]], np.float32)},
                  group_data=None)
  np.testing.assert_array_equal(
      store.local_parameters([1])[0]['w'], [9, 9, 9])
  np.testing.assert_array_equal(
      store.local_parameters([2])[0]['w'], [2, 2, 2])
  # (2 users x 2 + 2 users x 3) float32 over 4 users.
  assert store.bytes_per_user() == pytest.approx(4 * 10 / 4)
  with pytest.raises(ValueError, match='2 partitions'):
    store.stacked_local_parameters(np.array([0, 1]))


def test_user_states_across_partitions():
  store = _partitioned_store()
  store.put_user_states(
      [2, 3], [{'w': np.array([5, 5, 5])}, {'w': np.array([6, 6])}])
  got = store.local_parameters([3, 2, 0])
  assert [g['w'].tolist() for g in got] == [[6, 6], [5, 5, 5], [0, 0]]


def test_ragged_fields_against_a_dict_of_arrays():
  rng = np.random.default_rng(0)
  store = _partitioned_store(ragged={
      'rows': np.zeros([0, 3], np.float32), 'ids': np.zeros([0], np.int32)})
  expected = {user: (np.zeros([0, 3]), np.zeros([0])) for user in range(4)}
  for users in ([2, 0], [3], [0, 1, 3]):
    lengths = rng.integers(0, 4, size=len(users))
    rows = [rng.normal(size=[n, 3]) for n in lengths]
    ids = [rng.integers(0, 50, size=n) for n in lengths]
    store.put_ragged('rows', users, rows)
    store.put_ragged('ids', users, ids)
    expected.update(
        (user, (r, i)) for user, r, i in zip(users, rows, ids))

  restored = _partitioned_store(ragged={
      'rows': np.zeros([0, 3], np.float32), 'ids': np.zeros([0], np.int32)})
  restored.load_arrays(store.to_arrays())
  for user in range(4):
    for source in (store, restored):
      (rows,), (ids,) = source.ragged('rows', [user]), source.ragged(
          'ids', [user])
      np.testing.assert_allclose(rows, expected[user][0], rtol=1e-6)
      np.testing.assert_array_equal(ids, expected[user][1])
      assert rows.dtype == np.float32 and ids.dtype == np.int32
  total = sum(len(r) * 3 * 4 + len(i) * 4 for r, i in expected.values())
  assert store.bytes_per_user() == pytest.approx((4 * 10 + total) / 4)


def test_partitioned_round_trip_and_independence_from_the_arrays():
  store = _partitioned_store()
  store.put_local_parameters(np.array([3]), {'w': np.array([[8, 8]])})
  restored = _partitioned_store()
  arrays = store.to_arrays()

  restored.load_arrays(arrays)
  arrays['local_leaves'][0][:] = -1.0

  for user in range(4):
    np.testing.assert_array_equal(
        restored.local_parameters([user])[0]['w'],
        store.local_parameters([user])[0]['w'],
    )
  np.testing.assert_array_equal(restored.local_parameters([3])[0]['w'], [8, 8])


def test_arrays_without_copies_are_the_store_s_own_until_it_changes():
  store = _partitioned_store(ragged={'rows': np.zeros([0, 3], np.float32)})
  store.put_ragged('rows', [1], [np.ones([2, 3], np.float32)])
  views = store.to_arrays(copy=False)
  copies = store.to_arrays()
  store.put_local_parameters(np.array([3]), {'w': np.array([[5, 5]])})
  store.put_ragged('rows', [1], [np.zeros([4, 3], np.float32)])

  changed = [np.any(leaf == 5) for leaf in views['local_leaves']]
  assert any(changed)  # The stacked leaves are the store's arrays ...
  assert not any(np.any(leaf == 5) for leaf in copies['local_leaves'])
  # ... while a ragged field's values stay those of the call.
  for arrays in (views, copies):
    np.testing.assert_array_equal(arrays['ragged']['rows']['offsets'],
                                  [0, 0, 2, 2, 2])
    np.testing.assert_array_equal(arrays['ragged']['rows']['values'],
                                  np.ones([2, 3]))


def test_the_store_holds_one_copy_of_its_state_and_loads_into_it():
  # 100 users x 1000 x 8 float32 = 3.2 MB. numpy reports its arrays to
  # tracemalloc: building the store, or loading a checkpoint into it, must
  # not hold a second copy (FedRAS's ML-1M store is 2.9 GB).
  size = 100 * 1000 * 8 * 4
  tracemalloc.start()
  try:
    store = client_state_store.ClientStateStore(
        100, {'table': np.zeros([1000, 8], np.float32)})
    held, _ = tracemalloc.get_traced_memory()
    # Untouched, every user reads the one initial state ...
    assert held < 0.1 * size
    # ... and the first write makes the store's own copy, one.
    store.put_local_parameters(np.array([3]),
                               {'table': np.zeros([1, 1000, 8], np.float32)})
    held, peak = tracemalloc.get_traced_memory()
    assert size <= held < 1.2 * size and peak < 1.2 * size
    arrays = store.to_arrays()
    arrays['local_leaves'][0][7] = 1.0
    tracemalloc.reset_peak()
    before, _ = tracemalloc.get_traced_memory()
    store.load_arrays(arrays)
    _, peak = tracemalloc.get_traced_memory()
    assert peak - before < 0.2 * size
  finally:
    tracemalloc.stop()
  np.testing.assert_array_equal(store.local_parameters([7])[0]['table'], 1.0)
  np.testing.assert_array_equal(store.local_parameters([6])[0]['table'], 0.0)


def test_load_arrays_rejects_other_shapes():
  store = _partitioned_store()
  other = client_state_store.ClientStateStore(
      4, {'w': np.zeros([2], np.float32)})
  with pytest.raises(ValueError, match='do not match'):
    store.load_arrays(other.to_arrays())
  doubles = client_state_store.ClientStateStore.from_partitions(4, [
      (np.array([0, 3]), {'w': np.zeros([2, 2], np.float64)}),
      (np.array([2, 1]), {'w': np.zeros([2, 3], np.float32)}),
  ])
  with pytest.raises(ValueError, match='float64'):
    store.load_arrays(doubles.to_arrays())
  ragged = _partitioned_store(ragged={'rows': np.zeros([0, 3], np.float32)})
  wider = _partitioned_store(ragged={'rows': np.zeros([0, 4], np.float32)})
  with pytest.raises(ValueError, match='rows'):
    ragged.load_arrays(wider.to_arrays())


def test_from_partitions_rejects_users_missing_or_twice():
  with pytest.raises(ValueError, match='two partitions'):
    client_state_store.ClientStateStore.from_partitions(2, [
        (np.array([0, 1]), {'w': np.zeros([2])}),
        (np.array([1]), {'w': np.zeros([1])}),
    ])
  with pytest.raises(ValueError, match='Every user'):
    client_state_store.ClientStateStore.from_partitions(
        3, [(np.array([0, 1]), {'w': np.zeros([2])})])
