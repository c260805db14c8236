"""Tests of the store of FedRAP's D^(i): only trained rows are kept, rounds
merge (new rows replace old ones, other old rows decay), checkpoints round
trip."""

import collections

import numpy as np
import pytest

from tff_fedrec.algorithms.fedrap import client_state
from tff_fedrec.algorithms.fedrap import process

_NUM_USERS, _NUM_ITEMS, _DIM = 3, 10, 2


def _store():
  layers = [collections.OrderedDict(kernel=np.zeros([_DIM, 1], np.float32),
                                    bias=np.zeros([1], np.float32))]
  table = np.arange(_NUM_ITEMS * _DIM, dtype=np.float32).reshape(
      _NUM_ITEMS, _DIM)
  return client_state.PersonalTableStore(
      _NUM_USERS, process.initial_client_state(layers, _DIM), table
  ), table


def _group_state(ids, rows, scales, untrained_scales):
  """A group's state as the client work returns it (rows padded)."""
  width = max(len(i) for i in ids)
  padded_ids = np.zeros([len(ids), width], np.int32)
  padded_rows = np.full([len(ids), width, _DIM], 99.0, np.float32)
  for u, (user_ids, user_rows) in enumerate(zip(ids, rows)):
    padded_ids[u, : len(user_ids)] = user_ids
    padded_rows[u, : len(user_ids)] = user_rows
  return collections.OrderedDict(
      local_parameters=collections.OrderedDict(
          score_layers=[collections.OrderedDict(
              kernel=np.ones([len(ids), _DIM, 1], np.float32),
              bias=np.ones([len(ids), 1], np.float32))],
          untrained_row_scale=np.asarray(untrained_scales, np.float32),
          round_row_scale=np.asarray(scales, np.float32),
      ),
      personal_item_ids=padded_ids,
      personal_item_rows=padded_rows,
  ), np.array([len(i) for i in ids])


def _rows(value, count):
  return np.full([count, _DIM], value, np.float32)


def test_untrained_users_see_the_initial_table():
  store, table = _store()
  items = np.array([[0, 3], [9, 9], [1, 2]])
  np.testing.assert_array_equal(
      store.table_vectors(np.arange(3), items), table[items])


def test_rounds_merge_trained_rows_and_decay_the_others():
  store, table = _store()
  # Round 1: user 0 trains items 2 and 5 (scale 0.5), user 2 item 7.
  state, counts = _group_state([[2, 5], [7]], [_rows(1, 2), _rows(2, 1)],
                               [0.5, 0.8], [0.5, 0.8])
  store.put_group(np.array([0, 2]), state, {'num_rows': counts})
  # Round 2: user 0 trains items 5 and 8 (scale 0.25).
  state, counts = _group_state([[5, 8]], [_rows(3, 2)], [0.25], [0.125])
  store.put_group(np.array([0]), state, {'num_rows': counts})

  (user0,) = store.get([0])
  np.testing.assert_array_equal(user0['personal_item_ids'], [2, 5, 8])
  np.testing.assert_array_equal(
      user0['personal_item_rows'],
      np.concatenate([_rows(0.25, 1), _rows(3, 2)]))  # Row 2: 1 x 0.25.
  items = np.array([[2, 5, 8, 0], [2, 5, 8, 0], [7, 0, 2, 7]])
  vectors = store.table_vectors(np.array([0, 1, 2]), items)
  np.testing.assert_array_equal(vectors[0, :3], np.stack([[0.25] * 2,
                                                          [3] * 2, [3] * 2]))
  np.testing.assert_allclose(vectors[0, 3], table[0] * 0.125)
  np.testing.assert_array_equal(vectors[1], table[items[1]])
  np.testing.assert_array_equal(vectors[2, [0, 3]], _rows(2, 2))
  np.testing.assert_allclose(vectors[2, 1:3], table[[0, 2]] * 0.8)
  # Only trained rows (ids + rows) and D_0's share are held.
  local_bytes = 4 * (_DIM + 1 + 2)  # kernel, bias and the two scales.
  expected = (3 * local_bytes + (3 + 1) * (4 + 4 * _DIM)
              + table.nbytes) / 3
  assert store.bytes_per_user() == pytest.approx(expected)


def test_checkpoint_round_trip():
  store, _ = _store()
  state, counts = _group_state([[4, 1], [6]], [_rows(1, 2), _rows(2, 1)],
                               [0.5, 0.8], [0.5, 0.8])
  store.put_group(np.array([1, 2]), state, {'num_rows': counts})
  restored, _ = _store()
  restored.load_arrays(store.to_arrays())
  items = np.tile(np.arange(_NUM_ITEMS), [3, 1])
  np.testing.assert_array_equal(restored.table_vectors(np.arange(3), items),
                                store.table_vectors(np.arange(3), items))
  for want, got in zip(store.get(range(3)), restored.get(range(3))):
    np.testing.assert_array_equal(got['personal_item_ids'],
                                  want['personal_item_ids'])
    np.testing.assert_array_equal(
        got['local_parameters']['untrained_row_scale'],
        want['local_parameters']['untrained_row_scale'])
  assert restored.bytes_per_user() == store.bytes_per_user()
