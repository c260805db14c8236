"""Users grouped per TFF client: the grouping, and a round over a toy
process whose client data is the method's own."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import client_state_store
from tff_fedrec.programs import execution
from tff_fedrec.templates import two_phase
from tff_fedrec.templates import user_groups


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


# A process whose client state is one float per user: each user adds the
# sum of its values to its state, and the server counts the users. Its
# client data is its own: each user's values, padded, and their counts.
@tff.tensorflow.computation(
    np.float32, tff.TensorType(np.float32, [None]),
    (tff.TensorType(np.float32, [None, None]),
     tff.TensorType(np.int32, [None])),
)
def _client_update(unused_server, local, data):
  values, counts = data
  mask = tf.sequence_mask(counts, tf.shape(values)[1])
  added = tf.reduce_sum(tf.where(mask, values, 0.0), axis=1)
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
  values = [np.array(v, np.float32) for v in ([1, 2], [3], [4, 4, 4], [7])]
  observed = []
  with execution.worker_execution_context():
    state, metrics = user_groups.run_round(
        process, np.float32(0.0), store, users,
        sizes=[len(v) for v in values],
        make_group_data=lambda positions: (
            user_groups.pad_rows([values[p] for p in positions], np.float32),
            np.array([len(values[p]) for p in positions], np.int32)),
        users_per_group=3, keys=[0, 1, 0, 1], observe_uploads=observed.extend,
    )
  assert state == metrics == 4.0
  # User u starts at 100 u and adds the sum of its values; 3 and 4 sit out.
  np.testing.assert_array_equal(
      store.stacked_local_parameters(np.arange(6)),
      [0 + 7, 100 + 3, 200 + 12, 300, 400, 500 + 3],
  )
  # Key 0 (users 5, 2) in one group, key 1 (1, 0) in another; each group's
  # upload (its user count) seen with its positions and data.
  assert [positions.tolist() for positions, _, _ in observed] == [
      [0, 2], [1, 3]]
  assert [float(upload) for _, _, upload in observed] == [2.0, 2.0]
  np.testing.assert_array_equal(observed[0][1][0], [[1, 2, 0], [4, 4, 4]])


@pytest.mark.parametrize('cohort_size', [1, 2, 3, 100])
def test_a_round_in_cohorts_stores_each_users_state_and_sums_the_uploads(
    cohort_size):
  # Groups of one user; cohorts of 1, 2 or 3 groups (100: one computation).
  process = two_phase.TwoPhaseProcess(_initialize, _client_step, _server_step)
  store = client_state_store.ClientStateStore.from_partitions(
      6, [(np.arange(6), np.arange(6, dtype=np.float32) * 100)]
  )
  users = np.array([5, 1, 2, 0, 4])
  values = [np.array(v, np.float32)
            for v in ([1, 2], [3], [4, 4, 4], [7], [5, 6])]
  made = []

  def make_group_data(positions):
    made.append(positions.tolist())
    return (user_groups.pad_rows([values[p] for p in positions], np.float32),
            np.array([len(values[p]) for p in positions], np.int32))

  with execution.worker_execution_context():
    state, metrics = user_groups.run_round(
        process, np.float32(0.0), store, users,
        sizes=[len(v) for v in values], make_group_data=make_group_data,
        users_per_group=1, cohort_size=cohort_size,
    )
  assert state == metrics == 5.0
  np.testing.assert_array_equal(
      store.stacked_local_parameters(np.arange(6)),
      [0 + 7, 100 + 3, 200 + 12, 300, 400 + 11, 500 + 3],
  )
  assert sorted(map(tuple, made)) == [(0,), (1,), (2,), (3,), (4,)]


def test_pad_rows_pads_with_zeros_to_the_longest():
  padded = user_groups.pad_rows(
      [np.ones([2, 3]), np.ones([0, 3]), 2 * np.ones([1, 3])], np.float32)
  assert padded.shape == (3, 2, 3) and padded.dtype == np.float32
  np.testing.assert_array_equal(padded[:, :, 0], [[1, 1], [0, 0], [2, 0]])
