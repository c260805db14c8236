"""Tests of FedRAS's upload factory on hand-built gradients.

All computations run on one TFF worker owned by this module
(`execution.worker_execution_context`), stopped when the module is done.
"""

import collections

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_fedrec.algorithms.fedras import action_clustering
from tff_fedrec.algorithms.fedras import clustered_actions
from tff_fedrec.algorithms.fedras import row_codecs
from tff_fedrec.programs import execution

_NUM_ITEMS = 6
_DIM = 2


@pytest.fixture(scope='module', autouse=True)
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


def _group(users):
  """One TFF client's upload from [(item ids, rows, bandwidth, seed)]."""
  width = max(len(ids) for ids, *_ in users)
  row_ids = np.zeros([len(users), width], np.int32)
  values = np.full([len(users), width, _DIM], 55.0, np.float32)  # padding
  for user, (ids, rows, _, _) in enumerate(users):
    row_ids[user, : len(ids)] = ids
    values[user, : len(ids)] = rows
  return collections.OrderedDict(
      row_ids=row_ids,
      num_rows=np.array([len(ids) for ids, *_ in users], np.int32),
      row_values=values,
      bandwidth=np.array([e for *_, e, _ in users], np.int32),
      seeds=np.array([s for *_, s in users], np.int64),
      shared_seed=np.array([0, 3], np.int64),
  )


def _process(**kwargs):
  return clustered_actions.ClusteredActionsFactory(
      _NUM_ITEMS, **kwargs
  ).create(clustered_actions.upload_type(_DIM))


# Three users' item updates; user 1 trained item 4 without changing it.
_USER_0 = ([0, 2, 5], [[1.0, 2.0], [0.0, 4.0], [3.0, 3.0]], 3, [1, 1])
_USER_1 = ([2, 4], [[2.0, 0.0], [0.0, 0.0]], 3, [2, 2])
_USER_2 = ([0, 2, 3, 5], [[-1.0, 0.0], [4.0, 2.0], [6.0, 6.0], [1.0, 1.0]], 4,
           [3, 3])


def test_type_signature():
  process = _process()
  assert process.is_weighted is False
  assert str(process.next.type_signature.result.result) == (
      '<update=float32[6,2],participants=float32[6]>@SERVER'
  )
  measurements = process.next.type_signature.result.measurements.member
  assert [name for name, _ in tff.structure.iter_elements(measurements)] == [
      'uploaded_bytes', 'uploaded_users', 'compressed_users'
  ]


def test_exact_round_trip_and_participation_mean_within_the_bandwidth():
  process = _process()
  # Users 0 and 1 in one TFF client, user 2 in another.
  output = process.next(
      process.initialize(), [_group([_USER_0, _USER_1]), _group([_USER_2])]
  )

  # Nobody exceeded its bandwidth: every row arrives as sent, and each item
  # is averaged over the users that trained it (Sec. 4.4):
  # item 0: users 0, 2 -> ([1, 2] + [-1, 0]) / 2; item 2: users 0, 1, 2 ->
  # ([0, 4] + [2, 0] + [4, 2]) / 3; item 3: user 2 alone; item 4: user 1's
  # zero update over 1 participant; item 5: users 0, 2.
  np.testing.assert_allclose(
      output.result['update'],
      [[0, 1], [0, 0], [2, 2], [6, 6], [0, 0], [2, 2]],
      rtol=1e-6,
  )
  np.testing.assert_array_equal(
      output.result['participants'], [2, 0, 3, 1, 1, 2]
  )
  # Bytes by hand, 4 m d + T_u * 1: user 0 sends 3 rows (m = 3), user 1 one
  # non-zero row of its 2 (m = 1, 2 indices), user 2 four rows.
  assert output.measurements['uploaded_bytes'] == (
      (4 * 3 * 2 + 3) + (4 * 1 * 2 + 2) + (4 * 4 * 2 + 4)
  )
  assert output.measurements['uploaded_users'] == 3
  assert output.measurements['compressed_users'] == 0


def test_rows_over_the_bandwidth_arrive_as_their_clusters():
  # User 2 has 4 non-zero rows and bandwidth 2: k-means into 2 actions.
  user = (*_USER_2[:2], 2, _USER_2[3])
  process = _process()

  output = process.next(process.initialize(), [_group([user])])

  ids, rows, bandwidth, seed = user
  expected = action_clustering.encode_actions(
      np.asarray(rows, np.float32), bandwidth, np.asarray(seed, np.int64)
  )
  assert bool(expected.compressed)
  decoded = action_clustering.decode_actions(
      expected.actions, expected.action_index
  ).numpy()
  table = np.zeros([_NUM_ITEMS, _DIM], np.float32)
  table[ids] = decoded
  np.testing.assert_allclose(output.result['update'], table, rtol=1e-6)
  # Four distinct rows cannot all be one of 2 actions.
  assert not np.allclose(decoded, rows)
  assert output.measurements['uploaded_bytes'] == 4 * 2 * 2 + 4
  assert output.measurements['compressed_users'] == 1


def test_grouping_users_in_tff_clients_does_not_change_the_result():
  process = _process()
  grouped = process.next(
      process.initialize(), [_group([_USER_0, _USER_1, _USER_2])]
  )
  separate = process.next(
      process.initialize(),
      [_group([_USER_0]), _group([_USER_1]), _group([_USER_2])],
  )
  for key in ('update', 'participants'):
    np.testing.assert_allclose(
        grouped.result[key], separate.result[key], rtol=1e-6
    )
  assert grouped.measurements == separate.measurements


def test_clients_normalization_is_fedavg_over_all_users():
  process = _process(normalization='clients')

  output = process.next(
      process.initialize(), [_group([_USER_0, _USER_1]), _group([_USER_2])]
  )

  # Sums over the 3 users, zeros included: item 0 (1 - 1, 2 + 0) / 3.
  np.testing.assert_allclose(
      output.result['update'],
      np.array([[0, 2], [0, 0], [6, 6], [6, 6], [0, 0], [4, 4]]) / 3,
      rtol=1e-6,
  )


def test_a_baseline_codec_is_aggregated_and_counted_the_same_way():
  # User 0's budget (bandwidth 3, T_u = 3, d = 2): its FedRAS message,
  # 4 * 3 * 2 + 3 * 1 = 27 bytes, buys k = floor(27 / (3 * 5)) = 1.
  process = _process(codec=row_codecs.TopK())

  output = process.next(process.initialize(), [_group([_USER_0])])

  # Each row keeps its larger-magnitude entry (ties: the lower column).
  np.testing.assert_allclose(
      output.result['update'],
      [[0, 2], [0, 0], [0, 4], [0, 0], [0, 0], [3, 0]],
  )
  # 3 rows x 1 kept entry x (4 value bytes + 1 column byte).
  assert output.measurements['uploaded_bytes'] == 3 * 1 * 5


def test_rejects_other_values_and_settings():
  factory = clustered_actions.ClusteredActionsFactory(_NUM_ITEMS)
  with pytest.raises(TypeError, match='upload_type'):
    factory.create(tff.TensorType(np.float32, [_NUM_ITEMS, _DIM]))
  with pytest.raises(ValueError, match='normalization'):
    clustered_actions.ClusteredActionsFactory(_NUM_ITEMS, normalization='x')
  with pytest.raises(ValueError, match='num_items'):
    clustered_actions.ClusteredActionsFactory(0)
