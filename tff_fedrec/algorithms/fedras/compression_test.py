"""Tests of the compression baselines, their byte counts and Sec. 4.4."""

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec.algorithms.fedras import action_clustering
from tff_fedrec.algorithms.fedras import compression

_SEED = tf.constant([4, 2], tf.int64)


def _random_rows(seed, shape):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_index_bytes_at_the_width_boundaries():
  # 2^8 = 256 values fit a byte, 2^16 = 65,536 two.
  assert compression.index_bytes(1) == 1
  assert compression.index_bytes(256) == 1
  assert compression.index_bytes(257) == 2
  assert compression.index_bytes(65536) == 2
  assert compression.index_bytes(65537) == 4
  with pytest.raises(ValueError):
    compression.index_bytes(0)


@pytest.mark.parametrize(
    'scheme,num_rows,dim,parameter,expected',
    [
        # n = 5 rows of d = 3, dense 4 * 5 * 3 = 60 bytes.
        # 2 values of 4 bytes and 2 one-byte column indices per row.
        ('top_k', 5, 3, 2, 5 * 2 * (4 + 1)),
        # U_2 S_2 [5, 2] and V_2^T [2, 3] in floats.
        ('svd', 5, 3, 2, 4 * (5 * 2 + 2 * 3)),
        # A [5, 2] only; B comes from the seed.
        ('colr', 5, 3, 2, 4 * 5 * 2),
        # 2 centroids [2, 3] and 5 one-byte indices (3 values: 0, 1, -1).
        ('fedras', 5, 3, 2, 4 * 2 * 3 + 5 * 1),
        # 300 columns: a column index needs two bytes.
        ('top_k', 2, 300, 4, 2 * 4 * (4 + 2)),
        # 255 groups and "not sent" are 256 values, one byte; 256 are 257.
        ('fedras', 1000, 8, 255, 4 * 255 * 8 + 1000 * 1),
        ('fedras', 1000, 8, 256, 4 * 256 * 8 + 1000 * 2),
    ],
)
def test_encoded_bytes_by_hand(scheme, num_rows, dim, parameter, expected):
  assert (
      compression.encoded_bytes(scheme, num_rows, dim, parameter)
      == expected
  )


def test_compression_rate_is_one_minus_the_byte_ratio():
  # colr rank 2 of d = 32 sends 2 / 32 of the floats: CR = 1 - 1/16.
  assert compression.dense_bytes(3706, 32) == 4 * 3706 * 32
  assert compression.compression_rate('colr', 3706, 32, 2) == 0.9375


def test_encoded_bytes_match_the_tensors_each_encoder_returns():
  rows = _random_rows(0, [6, 5])
  rows[2] = 0.0  # Not sent by FedRAS: index -1.
  n, d = rows.shape

  def float_bytes(*tensors):
    return sum(4 * int(np.prod(t.shape)) for t in tensors)

  def index_bytes(tensor, num_values):
    size = int(np.prod(tensor.shape))
    return size * compression.index_bytes(num_values)

  top_k = compression.top_k_encode(rows, 3)
  svd = compression.svd_encode(rows, 2)
  colr = compression.colr_encode(
      rows, compression.colr_projection(_SEED, 2, d)
  )
  fedras = action_clustering.encode_actions(rows, 3, _SEED)

  # Each index tensor at the width its value range needs.
  assert float_bytes(top_k.values) + index_bytes(
      top_k.indices, d
  ) == compression.encoded_bytes('top_k', n, d, 3)
  assert float_bytes(*svd) == compression.encoded_bytes(
      'svd', n, d, 2
  )
  assert float_bytes(colr) == compression.encoded_bytes(
      'colr', n, d, 2
  )
  num_actions = fedras.actions.shape[0]
  assert num_actions == 3 and bool(fedras.compressed)
  assert float_bytes(fedras.actions) + index_bytes(
      fedras.action_index, num_actions + 1
  ) == compression.encoded_bytes('fedras', n, d, num_actions)


def test_bad_scheme_or_parameter_is_refused():
  with pytest.raises(ValueError, match='Unknown scheme'):
    compression.encoded_bytes('zip', 5, 3, 1)
  with pytest.raises(ValueError, match=r'\[1, 3\]'):
    compression.encoded_bytes('top_k', 5, 3, 4)
  with pytest.raises(ValueError, match=r'\[1, 2\]'):
    compression.encoded_bytes('svd', 2, 3, 3)
  with pytest.raises(ValueError):
    compression.pick_parameter('svd', 5, 3, 1.0)
  for num_rows, dim in ((0, 3), (5, 0)):
    with pytest.raises(ValueError, match='num_rows and dim must be >= 1'):
      compression.encoded_bytes('svd', num_rows, dim, 1)
  # One row of width 1 is the smallest matrix: a rank-1 SVD of 4 (1 + 1).
  assert compression.encoded_bytes('svd', 1, 1, 1) == 8


def test_a_rate_of_zero_picks_the_largest_parameter():
  # colr's CR is 1 - r / d: rank d = 8, the largest valid, is exactly 0.
  assert compression.pick_parameter('colr', 10, 8, 0.0) == 8


# ML-100K, ML-1M and Lastfm-2K item counts (FedRAS Table 2) at the paper's
# widths and compression rates (Table 1, Sec. 5.6).
@pytest.mark.parametrize('scheme', compression.SCHEMES)
@pytest.mark.parametrize(
    'num_rows,dim', [(1682, 32), (3706, 32), (12399, 64)]
)
@pytest.mark.parametrize('rate', [0.9063, 0.9375, 0.9688])
def test_picked_parameter_lands_within_two_points(scheme, num_rows, dim, rate):
  chosen = compression.pick_parameter(scheme, num_rows, dim, rate)

  measured = compression.compression_rate(
      scheme, num_rows, dim, chosen
  )
  assert abs(measured - rate) <= 0.02


def test_picked_parameters_for_ml_1m_by_hand():
  # N = 3706, d = 32, CR = 93.75%: budget 474,368 * 0.0625 = 29,648 bytes.
  # colr rank 2: 4 * 3706 * 2 = 29,648 exactly. svd rank 2: 4 * 2 *
  # (3706 + 32) = 29,904, CR 0.93696. top_k: 5 bytes per entry, 1 - 5k/128
  # = 0.9609 (k = 1) or 0.9219 (k = 2), the latter closer. fedras: 3706
  # one-byte indices leave 25,942 bytes, 202.7 centroids of 128 bytes;
  # m = 203 gives 29,690 bytes (CR 0.93741), m = 202 gives 29,562 (0.93768).
  assert compression.pick_parameter('colr', 3706, 32, 0.9375) == 2
  assert compression.pick_parameter('svd', 3706, 32, 0.9375) == 2
  assert compression.pick_parameter('top_k', 3706, 32, 0.9375) == 2
  assert compression.pick_parameter('fedras', 3706, 32, 0.9375) == 203


def test_top_k_keeps_the_largest_magnitudes_of_each_row():
  rows = np.array([[1.0, -5.0, 3.0, 0.5], [0.0, 2.0, -2.5, 1.0]], np.float32)

  message = compression.top_k_encode(rows, 2)
  decoded = compression.top_k_decode(message, 4)

  # Row 0: |-5| > |3| > |1| > |0.5|; row 1: |-2.5| > |2| > |1| > 0.
  np.testing.assert_array_equal(message.indices, [[1, 2], [2, 1]])
  np.testing.assert_array_equal(message.values, [[-5, 3], [-2.5, 2]])
  np.testing.assert_array_equal(
      decoded, [[0, -5, 3, 0], [0, 2, -2.5, 0]]
  )


def test_top_k_of_every_entry_round_trips():
  rows = _random_rows(1, [7, 5])

  message = compression.top_k_encode(rows, 5)

  np.testing.assert_array_equal(
      compression.top_k_decode(message, 5), rows
  )


def test_svd_at_full_rank_reconstructs():
  rows = _random_rows(2, [9, 4])

  message = compression.svd_encode(rows, 4)

  assert message.left.shape == (9, 4) and message.right.shape == (4, 4)
  np.testing.assert_allclose(
      compression.low_rank_decode(message), rows, atol=1e-5
  )


def test_truncated_svd_error_is_the_dropped_singular_values():
  rows = _random_rows(3, [12, 6])
  singular_values = np.linalg.svd(rows.astype(np.float64), compute_uv=False)

  decoded = compression.low_rank_decode(
      compression.svd_encode(rows, 2)
  )

  # Eckart-Young: ||rows - best rank 2||_F^2 = sum of the other sigma^2.
  np.testing.assert_allclose(
      np.sum(np.square(rows - decoded)),
      np.sum(np.square(singular_values[2:])),
      rtol=1e-4,
  )


def test_colr_projection_is_regenerated_from_the_seed():
  first = compression.colr_projection(_SEED, 3, 8)
  again = compression.colr_projection(_SEED, 3, 8)
  other = compression.colr_projection(tf.constant([4, 3]), 3, 8)

  assert first.shape == (3, 8)
  np.testing.assert_array_equal(first, again)
  assert not np.allclose(first, other)


def test_colr_projection_entries_have_variance_one_over_rank():
  # 4 x 50,000 draws: the sample variance is within a few 1e-3 of 1/4.
  projection = compression.colr_projection(_SEED, 4, 50_000)

  np.testing.assert_allclose(np.var(projection), 0.25, atol=0.005)


def test_colr_decode_is_a_times_the_regenerated_b():
  a = _random_rows(4, [6, 2])
  b = compression.colr_projection(_SEED, 2, 5).numpy()

  decoded = compression.colr_decode(
      a, compression.colr_projection(_SEED, 2, 5)
  )

  np.testing.assert_allclose(decoded, a @ b, rtol=1e-6)
  # And the encoder recovers A from A B.
  np.testing.assert_allclose(
      compression.colr_encode(a @ b, b), a, atol=1e-5
  )


def test_colr_encode_is_the_least_squares_a():
  rows = _random_rows(5, [7, 5])
  b = compression.colr_projection(_SEED, 2, 5).numpy()

  got = compression.colr_encode(rows, b)

  expected = np.linalg.lstsq(
      b.T.astype(np.float64), rows.T.astype(np.float64), rcond=None
  )[0].T
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_colr_gradient_map_is_the_step_of_training_a_on_the_authors_factor():
  """One SGD step on A, B orthonormal rows scaled by sqrt(d / r) and A's
  gradient scaled by sqrt(r / d) (CoLR's public code), moves the rows by
  -lr G M for M of any factor with B's row space."""
  rank, dim, lr = 2, 5, 0.3
  rng = np.random.default_rng(3)
  grads = rng.normal(size=[7, dim])
  orthonormal = np.linalg.qr(rng.normal(size=[dim, rank]))[0].T
  authors_b = np.sqrt(dim / rank) * orthonormal
  a_step = -lr * np.sqrt(rank / dim) * grads @ authors_b.T
  gaussian_b = rng.normal(size=[rank, rank]) @ orthonormal  # same row space

  got = compression.colr_gradient_map(gaussian_b.astype(np.float32))

  np.testing.assert_allclose(
      -lr * grads @ got.numpy(), a_step @ authors_b, rtol=1e-4, atol=1e-5
  )
  # sqrt(d / r) times the orthogonal projection: symmetric, M M = sqrt(d/r) M.
  np.testing.assert_allclose(got, np.transpose(got), atol=1e-5)
  np.testing.assert_allclose(
      got.numpy() @ got.numpy(), np.sqrt(dim / rank) * got.numpy(), atol=1e-4
  )


def test_colr_gradient_map_of_a_full_rank_factor_is_the_identity():
  factor = compression.colr_round_factor(_SEED, 6)

  np.testing.assert_allclose(
      compression.colr_gradient_map(factor), np.eye(6), atol=1e-4
  )


def test_item_participation_mean_matches_numpy():
  updates = _random_rows(6, [4, 6, 3])
  participation = np.random.default_rng(7).random([4, 6]) < 0.5
  participation[:, 5] = False  # An item nobody trained.
  participation[:, 0] = True  # One everybody trained.

  got = compression.item_participation_mean(updates, participation)

  expected = np.zeros([6, 3])
  for item in range(6):
    trainers = np.flatnonzero(participation[:, item])
    if trainers.size:
      expected[item] = updates[trainers, item].mean(axis=0)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(got[5], 0.0)


def test_normalize_by_participation_by_hand():
  # Sec. 4.4: 1/|S_t| sum_u dq^u * |S_t| / |S^i| = sum_u dq^u / |S^i|.
  # Items trained by 2, 1 and 0 of the round's clients.
  update_sum = np.array([[8.0], [4.0], [0.0]], np.float32)

  got = compression.normalize_by_participation(
      update_sum, [2, 1, 0]
  )

  np.testing.assert_array_equal(got, [[4.0], [4.0], [0.0]])


def test_encoders_trace_with_unknown_row_count():
  rows = _random_rows(8, [5, 4])

  @tf.function(
      input_signature=[
          tf.TensorSpec([None, 4], tf.float32),
          tf.TensorSpec([], tf.int32),
      ]
  )
  def round_trips(rows, parameter):
    top_k = compression.top_k_decode(
        compression.top_k_encode(rows, parameter), 4
    )
    svd = compression.low_rank_decode(
        compression.svd_encode(rows, parameter)
    )
    projection = compression.colr_projection(
        tf.constant([4, 2], tf.int64), parameter, 4
    )
    colr = compression.colr_decode(
        compression.colr_encode(rows, projection), projection
    )
    return top_k, svd, colr

  for parameter in (4, 2):
    top_k, svd, colr = round_trips(rows, parameter)
    np.testing.assert_array_equal(
        top_k,
        compression.top_k_decode(
            compression.top_k_encode(rows, parameter), 4
        ),
    )
    np.testing.assert_allclose(
        svd,
        compression.low_rank_decode(
            compression.svd_encode(rows, parameter)
        ),
        atol=1e-5,
    )
    assert colr.shape == rows.shape
  # At full width every scheme is lossless.
  top_k, svd, colr = round_trips(rows, 4)
  np.testing.assert_array_equal(top_k, rows)
  np.testing.assert_allclose(svd, rows, atol=1e-5)
  np.testing.assert_allclose(colr, rows, atol=1e-4)
  assert round_trips.experimental_get_tracing_count() == 1


def test_aggregation_runs_in_a_tf1_graph():
  graph = tf.Graph()
  with graph.as_default():
    updates = tf.compat.v1.placeholder(tf.float32, [None, None, 2])
    participation = tf.compat.v1.placeholder(tf.bool, [None, None])
    mean = compression.item_participation_mean(
        updates, participation
    )
    with tf.compat.v1.Session(graph=graph) as session:
      got = session.run(
          mean,
          {
              # Client 1 trained item 0 only; its item 1 row is ignored.
              updates: [[[2, 0], [4, 4]], [[6, 2], [100, 100]]],
              participation: [[True, True], [True, False]],
          },
      )

  np.testing.assert_array_equal(got, [[4, 1], [4, 4]])


def test_scatter_rows_sums_real_rows_and_counts_senders():
  # User 0 sends items 2 and 0; user 1 sends item 2 and one padding row.
  rows = [[[1.0, 2.0], [3.0, 4.0]], [[10.0, 20.0], [99.0, 99.0]]]
  update_sum, participants = compression.scatter_rows(
      rows, [2, 1], [[2, 0], [2, 1]], num_items=3
  )
  np.testing.assert_array_equal(update_sum, [[3, 4], [0, 0], [11, 22]])
  np.testing.assert_array_equal(participants, [1, 0, 2])
