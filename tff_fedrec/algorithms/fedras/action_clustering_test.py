"""Tests of the client's action-sharing rule (FedRAS Sec. 4.2)."""

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec.algorithms.fedras import action_clustering

_SEED = tf.constant([7, 11], tf.int64)


def test_sent_rows_are_the_real_non_zero_rows():
  rows = np.array([[0, 0], [0, 2], [3, 0], [1, 1]], np.float32)

  got = action_clustering.sent_rows(rows, row_mask=[1, 1, 1, 0])

  np.testing.assert_array_equal(got, [False, True, True, False])


def test_within_bandwidth_is_sent_uncompressed_and_round_trips_exactly():
  rows = np.array(
      [[0.5, -1.0], [0.0, 0.0], [2.0, 3.0], [0.0, 0.0], [-4.0, 0.25]],
      np.float32,
  )

  # Three non-zero rows against a bandwidth of exactly three rows.
  message = action_clustering.encode_actions(rows, 3, _SEED)

  assert not message.compressed
  # The codebook is the non-zero rows in order; zero rows are not sent.
  np.testing.assert_array_equal(message.actions, rows[[0, 2, 4]])
  np.testing.assert_array_equal(message.action_index, [0, -1, 1, -1, 2])
  np.testing.assert_array_equal(
      action_clustering.decode_actions(
          message.actions, message.action_index
      ),
      rows,
  )


def test_over_bandwidth_is_clustered_into_bandwidth_actions():
  # Three tight groups far apart (4, 2 and 3 rows), two zero rows and a
  # padding row.
  centres = np.array([[10, 0, 0], [0, 10, 0], [0, 0, 10]], np.float32)
  labels = np.array([0, 1, 2, 0, 2, 0, 1, 2, 0])
  offsets = np.random.default_rng(6).uniform(-0.01, 0.01, [9, 3])
  clustered = (centres[labels] + offsets).astype(np.float32)
  rows = np.concatenate([clustered, np.zeros([2, 3], np.float32),
                         np.ones([1, 3], np.float32)])
  mask = np.array([1] * (len(rows) - 1) + [0])

  # Nine non-zero rows over a bandwidth of three: k-means into 3 actions.
  message = action_clustering.encode_actions(rows, 3, _SEED, row_mask=mask)

  assert message.compressed
  assert message.actions.shape == (3, 3)
  index = message.action_index.numpy()
  np.testing.assert_array_equal(index[9:], [-1, -1, -1])
  # The rows of one group share an action, and each group has its own.
  assert len({(a, b) for a, b in zip(index[:9], labels)}) == 3
  assert len(set(index[:9].tolist())) == 3
  decoded = action_clustering.decode_actions(message.actions, index).numpy()
  # Each row decodes to the mean of its true cluster, zeros to zero.
  for cluster in range(3):
    np.testing.assert_allclose(
        decoded[:9][labels == cluster],
        np.broadcast_to(
            clustered[labels == cluster].mean(axis=0),
            [np.sum(labels == cluster), 3],
        ),
        rtol=1e-6,
    )
  np.testing.assert_array_equal(decoded[9:], 0.0)


def test_decode_by_hand_including_an_empty_codebook():
  actions = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)

  got = action_clustering.decode_actions(actions, [1, -1, 0, 1])
  nothing = action_clustering.decode_actions(
      np.zeros([0, 2], np.float32), [-1, -1]
  )

  np.testing.assert_array_equal(got, [[3, 4], [0, 0], [1, 2], [3, 4]])
  np.testing.assert_array_equal(nothing, np.zeros([2, 2]))


@pytest.mark.parametrize('bandwidth', [2, 9])
def test_encode_and_decode_in_a_tf1_graph_match_eager(bandwidth):
  rows = np.random.default_rng(8).normal(size=[8, 3]).astype(np.float32)

  graph = tf.Graph()
  with graph.as_default():
    rows_in = tf.compat.v1.placeholder(tf.float32, [None, 3])
    bandwidth_in = tf.compat.v1.placeholder(tf.int32, [])
    message = action_clustering.encode_actions(
        rows_in, bandwidth_in, tf.constant([7, 11], tf.int64)
    )
    decoded = action_clustering.decode_actions(
        message.actions, message.action_index
    )
    with tf.compat.v1.Session(graph=graph) as session:
      got_message, got_decoded = session.run(
          (message, decoded), {rows_in: rows, bandwidth_in: bandwidth}
      )

  eager = action_clustering.encode_actions(rows, bandwidth, _SEED)
  assert got_message.compressed == (bandwidth < len(rows))
  np.testing.assert_allclose(got_message.actions, eager.actions, rtol=1e-6)
  np.testing.assert_array_equal(got_message.action_index, eager.action_index)
  np.testing.assert_allclose(
      got_decoded,
      action_clustering.decode_actions(eager.actions, eager.action_index),
      rtol=1e-6,
  )
