"""Tests of the batched upload codecs and their byte counts."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec import action_clustering
from tff_fedrec import gradient_compression
from tff_fedrec.aggregators import row_codecs

_DIM = 3
_SHARED_SEED = np.array([5, 1], np.int64)
_SEEDS = np.array([[1, 2], [3, 4], [5, 6]], np.int64)


def _group():
  """Three users with 5, 2 and 4 real rows of width 3; user 0's row 3 is
  zero (trained, unchanged), padding is filled with junk that must not
  leak into any message."""
  rng = np.random.default_rng(0)
  rows = rng.normal(size=[3, 5, _DIM]).astype(np.float32)
  rows[0, 3] = 0.0
  num_rows = np.array([5, 2, 4], np.int32)
  rows[1, 2:] = 100.0
  rows[2, 4:] = -100.0
  return rows, num_rows


def _real(rows, num_rows):
  mask = np.arange(rows.shape[1])[None, :] < num_rows[:, None]
  return rows * mask[..., None]


@pytest.mark.parametrize('scheme', gradient_compression.SCHEMES)
def test_encoded_bytes_equals_the_python_accounting(scheme):
  num_rows = [1, 7, 255, 256, 300, 3706]
  dims = [1, 4, 32, 300]
  for n, d in itertools.product(num_rows, dims):
    largest = {'top_k': d, 'svd': min(n, d), 'colr': d, 'fedras': n}[scheme]
    # Around every index-width boundary a parameter can cross.
    parameters = {
        p for p in (1, 2, 254, 255, 256, 65535, 65536, largest)
        if p <= largest
    }
    for p in sorted(parameters):
      got = row_codecs.encoded_bytes(scheme, n, d, p)
      assert got.dtype == tf.int64
      assert int(got) == gradient_compression.encoded_bytes(scheme, n, d, p)


def test_encoded_bytes_of_an_empty_message_is_zero():
  assert int(row_codecs.encoded_bytes('fedras', 0, 4, 0)) == 0
  assert int(row_codecs.encoded_bytes('svd', 0, 4, 0)) == 0
  with pytest.raises(ValueError, match='Unknown scheme'):
    row_codecs.encoded_bytes('zip', 1, 1, 1)


def test_clustered_actions_round_trip_is_exact_within_the_bandwidth():
  rows, num_rows = _group()
  codec = row_codecs.ClusteredActions()
  bandwidth = np.array([4, 2, 9], np.int32)  # user 0: 4 non-zero rows

  message = codec.encode(rows, num_rows, bandwidth, _SEEDS, _SHARED_SEED)
  decoded = codec.decode(message, _SHARED_SEED, _DIM)

  np.testing.assert_array_equal(decoded, _real(rows, num_rows))
  np.testing.assert_array_equal(message['compressed'], [False] * 3)
  np.testing.assert_array_equal(message['num_actions'], [4, 2, 4])
  # The zero row and padding are not sent: index -1.
  np.testing.assert_array_equal(message['action_index'][0], [0, 1, 2, -1, 3])
  np.testing.assert_array_equal(message['action_index'][1], [0, 1, -1, -1, -1])
  # M = min(T, max e_u) = 5 slots; a user's unused slots are zero.
  assert message['actions'].shape == (3, 5, _DIM)
  np.testing.assert_array_equal(message['actions'][1, 2:], 0.0)
  # 4 m d + T_u bytes (m + 1 <= 256 index values: one byte each).
  np.testing.assert_array_equal(
      codec.message_bytes(message, num_rows, _DIM),
      [4 * 4 * 3 + 5, 4 * 2 * 3 + 2, 4 * 4 * 3 + 4],
  )


def test_clustered_actions_cluster_each_user_with_its_own_bandwidth_and_seed():
  rows, num_rows = _group()
  codec = row_codecs.ClusteredActions()
  bandwidth = np.array([2, 1, 3], np.int32)

  message = codec.encode(rows, num_rows, bandwidth, _SEEDS, _SHARED_SEED)
  decoded = codec.decode(message, _SHARED_SEED, _DIM).numpy()

  np.testing.assert_array_equal(message['compressed'], [True] * 3)
  np.testing.assert_array_equal(message['num_actions'], [2, 1, 3])
  for user in range(3):
    mask = np.arange(5) < num_rows[user]
    expected = action_clustering.encode_actions(
        rows[user], bandwidth[user], _SEEDS[user], row_mask=mask
    )
    np.testing.assert_allclose(
        decoded[user],
        action_clustering.decode_actions(
            expected.actions, expected.action_index
        ),
        rtol=1e-6,
    )
  # User 1: its two rows averaged into one action.
  np.testing.assert_allclose(
      decoded[1, :2], np.tile(rows[1, :2].mean(axis=0), [2, 1]), rtol=1e-6
  )
  np.testing.assert_array_equal(decoded[1, 2:], 0.0)
  np.testing.assert_array_equal(
      codec.message_bytes(message, num_rows, _DIM),
      [4 * 2 * 3 + 5, 4 * 1 * 3 + 2, 4 * 3 * 3 + 4],
  )


def test_top_k_keeps_each_real_rows_largest_entries():
  rows, num_rows = _group()
  codec = row_codecs.TopK(2)

  message = codec.encode(rows, num_rows, None, None, _SHARED_SEED)
  decoded = codec.decode(message, _SHARED_SEED, _DIM).numpy()

  real = _real(rows, num_rows)
  smallest = np.argmin(np.abs(real), axis=-1)
  expected = real.copy()
  np.put_along_axis(expected, smallest[..., None], 0.0, axis=-1)
  np.testing.assert_array_equal(decoded, expected)
  # T_u k (4 + 1) bytes: d = 3 columns fit a one-byte index.
  np.testing.assert_array_equal(
      codec.message_bytes(message, num_rows, _DIM), [5 * 2 * 5, 2 * 2 * 5,
                                                     4 * 2 * 5],
  )


def test_svd_is_each_users_truncated_svd_and_counts_its_real_rank():
  rows, num_rows = _group()
  codec = row_codecs.Svd(2)

  message = codec.encode(rows, num_rows, None, None, _SHARED_SEED)
  decoded = codec.decode(message, _SHARED_SEED, _DIM).numpy()

  for user in range(3):
    real = rows[user, : num_rows[user]]
    u, s, vt = np.linalg.svd(real, full_matrices=False)
    expected = (u[:, :2] * s[:2]) @ vt[:2]
    np.testing.assert_allclose(
        decoded[user, : num_rows[user]], expected, atol=1e-5
    )
    np.testing.assert_allclose(decoded[user, num_rows[user]:], 0.0, atol=1e-6)
  # User 1 has 2 rows: rank 2 reproduces them exactly.
  np.testing.assert_allclose(decoded[1, :2], rows[1, :2], atol=1e-5)
  # 4 r (T_u + d), r = min(2, T_u).
  np.testing.assert_array_equal(
      codec.message_bytes(message, num_rows, _DIM),
      [4 * 2 * (5 + 3), 4 * 2 * (2 + 3), 4 * 2 * (4 + 3)],
  )
  one_row = codec.message_bytes(message, np.array([1, 2, 4], np.int32), _DIM)
  assert int(one_row[0]) == 4 * 1 * (1 + 3)


def test_colr_projects_onto_the_shared_factor():
  rng = np.random.default_rng(1)
  projection = gradient_compression.colr_projection(_SHARED_SEED, 2, _DIM)
  a = rng.normal(size=[3, 5, 2]).astype(np.float32)
  rows = np.einsum('utr,rd->utd', a, projection.numpy())
  num_rows = np.array([5, 2, 4], np.int32)
  codec = row_codecs.Colr(2)

  message = codec.encode(rows, num_rows, None, None, _SHARED_SEED)
  decoded = codec.decode(message, _SHARED_SEED, _DIM)

  # Rows in B's row space come back exactly, padding as zero.
  np.testing.assert_allclose(message['a'], _real(a, num_rows), atol=1e-5)
  np.testing.assert_allclose(decoded, _real(rows, num_rows), atol=1e-5)
  # Another round's seed is another factor.
  other = codec.decode(message, np.array([5, 2], np.int64), _DIM)
  assert not np.allclose(other, decoded, atol=1e-3)
  np.testing.assert_array_equal(
      codec.message_bytes(message, num_rows, _DIM), [4 * 5 * 2, 4 * 2 * 2,
                                                     4 * 4 * 2],
  )


def test_codecs_trace_in_graph_mode_with_unknown_sizes():
  codec = row_codecs.ClusteredActions()
  spec = (
      tf.TensorSpec([None, None, _DIM], tf.float32),
      tf.TensorSpec([None], tf.int32),
      tf.TensorSpec([None], tf.int32),
      tf.TensorSpec([None, 2], tf.int64),
  )

  @tf.function(input_signature=spec)
  def round_trip(rows, num_rows, bandwidth, seeds):
    message = codec.encode(rows, num_rows, bandwidth, seeds, _SHARED_SEED)
    return codec.decode(message, _SHARED_SEED, _DIM)

  rows, num_rows = _group()
  np.testing.assert_array_equal(
      round_trip(rows, num_rows, np.array([9, 9, 9], np.int32), _SEEDS),
      _real(rows, num_rows),
  )
