import collections

import numpy as np
import pytest

import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import client_state_store
from tff_fedrec.programs import execution
from tff_fedrec.templates import two_phase
from tff_fedrec.templates import user_groups


def _user(items, labels, seed):
  return collections.OrderedDict(
      items=np.array(items, np.int32),
      labels=np.array(labels, np.float32),
      seed=np.array(seed, np.int64),
  )


def test_group_positions_puts_users_of_similar_size_together():
  groups = user_groups.group_positions([5, 1, 9, 3, 7], users_per_group=2)
  assert [g.tolist() for g in groups] == [[1, 3], [0, 4], [2]]
  # Every position exactly once, also with one user per group.
  single = user_groups.group_positions([5, 1, 9], users_per_group=1)
  assert sorted(int(g[0]) for g in single) == [0, 1, 2]
  with pytest.raises(ValueError, match='users_per_group'):
    user_groups.group_positions([1], users_per_group=0)


def test_group_positions_never_mixes_keys():
  # Sizes 5 1 9 3 7 6 with keys 1 0 1 0 1 0: key 0 first (positions 1, 3,
  # 5 by size), then key 1 (0, 4, 2).
  groups = user_groups.group_positions(
      [5, 1, 9, 3, 7, 6], users_per_group=2, keys=[1, 0, 1, 0, 1, 0]
  )
  assert [g.tolist() for g in groups] == [[1, 3], [5], [0, 4], [2]]


def test_group_client_data_maps_each_user_to_its_compact_table():
  users = [
      _user([7, 3, 7, 9], [1, 0, 0, 1], [1, 2]),
      _user([4], [1], [3, 4]),
  ]
  data = user_groups.group_client_data(users)

  np.testing.assert_array_equal(data['num_rows'], [3, 1])
  np.testing.assert_array_equal(data['num_examples'], [4, 1])
  np.testing.assert_array_equal(data['seeds'], [[1, 2], [3, 4]])
  assert data['row_ids'].shape == (2, 3) and data['items'].shape == (2, 4)
  for index, user in enumerate(users):
    n, t = data['num_examples'][index], data['num_rows'][index]
    # Looking each example up in the compact table gives back its item.
    np.testing.assert_array_equal(
        data['row_ids'][index][data['items'][index, :n]], user['items']
    )
    np.testing.assert_array_equal(data['labels'][index, :n], user['labels'])
    assert len(set(data['row_ids'][index, :t].tolist())) == t
  # Padding is zero.
  assert data['labels'][1, 1:].tolist() == [0, 0, 0]




# A process whose client state is one float per user: each user adds the
# sum of its items to its state, and the server counts the users.
@tff.tensorflow.computation(
    np.float32, tff.TensorType(np.float32, [None]),
    collections.OrderedDict(
        row_ids=tff.TensorType(np.int32, [None, None]),
        num_rows=tff.TensorType(np.int32, [None]),
        items=tff.TensorType(np.int32, [None, None]),
        labels=tff.TensorType(np.float32, [None, None]),
        num_examples=tff.TensorType(np.int32, [None]),
        seeds=tff.TensorType(np.int64, [None, 2]),
    ),
)
def _client_update(unused_server, local, data):
  items = tf.gather(data['row_ids'], data['items'], batch_dims=1)
  mask = tf.sequence_mask(data['num_examples'], tf.shape(items)[1])
  added = tf.reduce_sum(
      tf.where(mask, tf.cast(items, tf.float32), 0.0), axis=1)
  return local + added, tf.cast(tf.shape(local)[0], tf.float32)


@tff.federated_computation
def _initialize():
  return tff.federated_value(np.float32(0.0), tff.SERVER)


@tff.federated_computation(
    tff.FederatedType(np.float32, tff.SERVER),
    tff.FederatedType(tff.TensorType(np.float32, [None]), tff.CLIENTS),
    tff.FederatedType(_client_update.type_signature.parameter[2], tff.CLIENTS),
)
def _client_step(state, local, data):
  return tff.federated_map(
      _client_update, (tff.federated_broadcast(state), local, data))


@tff.federated_computation(
    tff.FederatedType(np.float32, tff.SERVER),
    tff.FederatedType(np.float32, tff.CLIENTS),
)
def _server_step(state, users):
  total = tff.federated_sum(users)
  return total, total


def test_run_round_gives_every_user_its_own_new_state():
  process = two_phase.TwoPhaseProcess(_initialize, _client_step, _server_step)
  store = client_state_store.ClientStateStore.from_partitions(
      6, [(np.arange(6), np.arange(6, dtype=np.float32) * 100)]
  )
  users = np.array([5, 1, 2, 0])
  items = [[1, 2], [3], [4, 4, 4], [7]]
  user_data = [_user(i, [1] * len(i), [0, u]) for u, i in zip(users, items)]
  with execution.worker_execution_context():
    state, metrics = user_groups.run_round(
        process, np.float32(0.0), store, users, user_data,
        users_per_group=3, keys=[0, 1, 0, 1],
    )
  assert state == metrics == 4.0
  # User u starts at 100 u and adds the sum of its items; 3 and 4 sit out.
  np.testing.assert_array_equal(
      store.stacked_local_parameters(np.arange(6)),
      [0 + 7, 100 + 3, 200 + 12, 300, 400, 500 + 3],
  )
