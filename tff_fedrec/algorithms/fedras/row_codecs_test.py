"""Tests of the batched upload codecs and their byte counts."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec.algorithms.fedras import action_clustering
from tff_fedrec.algorithms.fedras import compression
from tff_fedrec.algorithms.fedras import row_codecs

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


@pytest.mark.parametrize('scheme', compression.SCHEMES)
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
      assert int(got) == compression.encoded_bytes(scheme, n, d, p)


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


# The baselines' hand case, d = 4: user u has T_u rows and bandwidth e_u.
# B_u = 4 min(T_u, e_u) 4 + T_u index_bytes(min(T_u, e_u) + 1), one-byte
# indices throughout: 32 + 5, 48 + 5, 32 + 2, 16 + 1 and 0 bytes.
_HAND_DIM = 4
_HAND_ROWS = np.array([5, 5, 2, 1, 0], np.int32)
_HAND_BANDWIDTH = np.array([2, 3, 2, 2, 2], np.int32)
_HAND_BUDGET = [37, 53, 34, 17, 0]
# p_u = clip(floor(B_u / c_u), 1, P_u), 0 for T_u = 0, with
#   top_k c = 5 T_u:       37 // 25, 53 // 25, 34 // 10, 17 // 5
#   svd   c = 4 (T_u + 4): 37 // 36, 53 // 36, 34 // 24, 17 // 20 -> 1
#   colr  c = 4 T_u:       37 // 20, 53 // 20, 34 // 8 = d, 17 // 4 = d
# so every user's message fits B_u except the one-row user's svd: rank 1
# costs 4 (1 + 4) = 20 > 17 bytes, and p = 1 is sent anyway.
_HAND = {
    'top_k': dict(
        parameter=[1, 2, 3, 3, 0],
        bytes=[25, 50, 30, 15, 0],
        compressed=[True, True, True, True, False],  # k < d = 4
    ),
    'svd': dict(
        parameter=[1, 1, 1, 1, 0],
        bytes=[36, 36, 24, 20, 0],
        compressed=[True, True, True, False, False],  # r < min(T_u, 4)
    ),
    'colr': dict(
        parameter=[1, 2, 4, 4, 0],
        bytes=[20, 40, 32, 16, 0],
        compressed=[True, True, False, False, False],  # r < d = 4
    ),
}
_BASELINE_CODECS = {
    'top_k': row_codecs.TopK, 'svd': row_codecs.Svd, 'colr': row_codecs.Colr
}


def _hand_group():
  """The hand case's rows, junk in the padding (it must not leak)."""
  rows = np.random.default_rng(2).normal(size=[5, 5, _HAND_DIM])
  rows = rows.astype(np.float32)
  mask = np.arange(5)[None, :] < _HAND_ROWS[:, None]
  return np.where(mask[..., None], rows, 50.0).astype(np.float32)


def _top_k_by_hand(rows, k):
  """Each row of rows [n, d] with all but its k largest |entries| zeroed
  (ties to the lower column, as tf.math.top_k)."""
  order = np.argsort(-np.abs(rows), axis=-1, kind='stable')
  kept = np.zeros_like(rows)
  np.put_along_axis(
      kept, order[:, :k], np.take_along_axis(rows, order[:, :k], -1), -1
  )
  return kept


def _truncated_svd_by_hand(rows, rank):
  u, s, vt = np.linalg.svd(rows.astype(np.float64), full_matrices=False)
  return (u[:, :rank] * s[:rank]) @ vt[:rank]


def _colr_by_hand(rows, rank, shared_seed, dim):
  """Least squares of rows [n, d] on the first `rank` rows of the round's
  B [d, d], decoded: A B_r with A = argmin ||A B_r - rows||."""
  projection = compression.colr_projection(shared_seed, dim, dim)
  b = projection.numpy().astype(np.float64)[:rank]
  a = np.linalg.lstsq(b.T, rows.astype(np.float64).T, rcond=None)[0].T
  return a @ b


def _by_hand(scheme, rows, rank):
  if scheme == 'top_k':
    return _top_k_by_hand(rows, rank)
  if scheme == 'svd':
    return _truncated_svd_by_hand(rows, rank)
  return _colr_by_hand(rows, rank, _SHARED_SEED, rows.shape[-1])


def test_upload_budget_is_fedras_message_size():
  np.testing.assert_array_equal(
      row_codecs.upload_budget(_HAND_ROWS, _HAND_BANDWIDTH, _HAND_DIM),
      _HAND_BUDGET,
  )
  # ClusteredActions sends exactly that when no row is zero: 2 actions of
  # 5 rows (clustered), 3 of 5, 2 of 2 and 1 of 1 (sent as they are).
  seeds = np.arange(10, dtype=np.int64).reshape([5, 2])
  codec = row_codecs.ClusteredActions()
  message = codec.encode(
      _hand_group(), _HAND_ROWS, _HAND_BANDWIDTH, seeds, _SHARED_SEED
  )
  np.testing.assert_array_equal(
      codec.message_bytes(message, _HAND_ROWS, _HAND_DIM), _HAND_BUDGET
  )


@pytest.mark.parametrize('scheme', row_codecs.BASELINES)
def test_baselines_spend_their_fedras_budget_by_hand(scheme):
  rows = _hand_group()
  codec = _BASELINE_CODECS[scheme]()
  hand = _HAND[scheme]

  np.testing.assert_array_equal(
      row_codecs.budget_parameter(
          scheme, _HAND_ROWS, _HAND_DIM, _HAND_BUDGET
      ),
      hand['parameter'],
  )
  message = codec.encode(rows, _HAND_ROWS, _HAND_BANDWIDTH, None, _SHARED_SEED)
  decoded = codec.decode(message, _SHARED_SEED, _HAND_DIM).numpy()

  np.testing.assert_array_equal(message['parameter'], hand['parameter'])
  np.testing.assert_array_equal(
      codec.message_bytes(message, _HAND_ROWS, _HAND_DIM), hand['bytes']
  )
  np.testing.assert_array_equal(
      codec.compressed(message, _HAND_ROWS), hand['compressed']
  )
  for user, (count, rank) in enumerate(zip(_HAND_ROWS, hand['parameter'])):
    if count:
      np.testing.assert_allclose(
          decoded[user, :count], _by_hand(scheme, rows[user, :count], rank),
          atol=1e-5,
      )
    # Padding, and all of the empty user, decode to exactly zero.
    np.testing.assert_array_equal(decoded[user, count:], 0.0)


@pytest.mark.parametrize('scheme', row_codecs.BASELINES)
def test_baseline_parameters_are_the_largest_the_budget_pays_for(scheme):
  """A random group against a search over every parameter with the
  Python byte accounting."""
  rng = np.random.default_rng(3)
  dim = 8
  # T_u >= 2 and e_u >= 2 give B_u >= 4 * 2 * 8 + T_u: with T_u <= 10 every
  # scheme's p = 1 fits (svd: 4 (10 + 8) = 72 <= 74).
  num_rows = np.concatenate([rng.integers(2, 11, 11), [0]]).astype(np.int32)
  bandwidth = rng.integers(2, 7, 12).astype(np.int32)
  rows = rng.normal(size=[12, 10, dim]).astype(np.float32)
  codec = _BASELINE_CODECS[scheme]()

  message = codec.encode(rows, num_rows, bandwidth, None, _SHARED_SEED)
  sent = codec.message_bytes(message, num_rows, dim).numpy()

  for user, (n, e) in enumerate(zip(num_rows, bandwidth)):
    n, e = int(n), int(e)
    if n == 0:
      assert message['parameter'][user] == 0 and sent[user] == 0
      continue
    budget = compression.encoded_bytes('fedras', n, dim, min(n, e))
    largest = min(n, dim) if scheme == 'svd' else dim
    fits = [
        p for p in range(1, largest + 1)
        if compression.encoded_bytes(scheme, n, dim, p) <= budget
    ]
    assert message['parameter'][user] == max(fits)
    assert sent[user] == compression.encoded_bytes(
        scheme, n, dim, max(fits)
    )
    assert sent[user] <= budget
  # Not every user is at the same parameter: the budget is per user.
  assert len(set(message['parameter'].numpy()[:-1])) > 1


def test_top_k_keeps_each_rows_largest_entries_at_each_users_k():
  rows, num_rows = _group()
  # B_u = 36 + 5, 24 + 2, 48 + 4 bytes; k_u = 41 // 25, 26 // 10, 52 // 20.
  bandwidth = np.array([3, 2, 9], np.int32)
  codec = row_codecs.TopK()

  message = codec.encode(rows, num_rows, bandwidth, None, _SHARED_SEED)
  decoded = codec.decode(message, _SHARED_SEED, _DIM).numpy()

  np.testing.assert_array_equal(message['parameter'], [1, 2, 2])
  real = _real(rows, num_rows)
  for user, k in enumerate([1, 2, 2]):
    np.testing.assert_array_equal(
        decoded[user], _top_k_by_hand(real[user], k)
    )
  # K = 2 slots; user 0's second is unsent: value 0, index -1.
  assert message['values'].shape == (3, 5, 2)
  np.testing.assert_array_equal(message['values'][0, :, 1], 0.0)
  np.testing.assert_array_equal(message['indices'][0, :, 1], -1)
  # T_u k_u (4 + 1) bytes: d = 3 columns fit a one-byte index.
  np.testing.assert_array_equal(
      codec.message_bytes(message, num_rows, _DIM),
      [5 * 1 * 5, 2 * 2 * 5, 4 * 2 * 5],
  )
  # An unsent slot whose index is stale (a column the row did send)
  # still adds nothing: its value is 0.
  stale = dict(message)
  stale['indices'] = tf.where(
      message['indices'] < 0, message['indices'][..., :1], message['indices']
  )
  np.testing.assert_array_equal(
      codec.decode(stale, _SHARED_SEED, _DIM), decoded
  )


def test_svd_is_each_users_truncated_svd_at_its_rank():
  rows, num_rows = _group()
  # B_u = 60 + 5, 24 + 2, 48 + 4 bytes; 4 (T_u + 3) per rank: r_u = 65 //
  # 32, 26 // 20, 52 // 28.
  bandwidth = np.array([5, 2, 9], np.int32)
  codec = row_codecs.Svd()

  message = codec.encode(rows, num_rows, bandwidth, None, _SHARED_SEED)
  decoded = codec.decode(message, _SHARED_SEED, _DIM).numpy()

  np.testing.assert_array_equal(message['parameter'], [2, 1, 1])
  for user, rank in enumerate([2, 1, 1]):
    real = rows[user, : num_rows[user]]
    np.testing.assert_allclose(
        decoded[user, : num_rows[user]], _truncated_svd_by_hand(real, rank),
        atol=1e-5,
    )
    np.testing.assert_array_equal(decoded[user, num_rows[user]:], 0.0)
  # R = 2; user 1's second column of U_r S_r and row of V_r^T are zero.
  assert message['left'].shape == (3, 5, 2)
  np.testing.assert_array_equal(message['left'][1, :, 1], 0.0)
  np.testing.assert_array_equal(message['right'][1, 1], 0.0)
  # 4 r_u (T_u + d); all lossy (r_u < min(T_u, 3)).
  np.testing.assert_array_equal(
      codec.message_bytes(message, num_rows, _DIM),
      [4 * 2 * (5 + 3), 4 * 1 * (2 + 3), 4 * 1 * (4 + 3)],
  )
  np.testing.assert_array_equal(
      codec.compressed(message, num_rows), [True] * 3
  )


def test_colr_projects_onto_the_first_rows_of_the_shared_factor():
  # B_u = 36 + 5, 24 + 2, 48 + 4 bytes; 4 T_u per rank: r_u = 41 // 20,
  # 26 // 8 -> d, 52 // 16 -> d.
  bandwidth = np.array([3, 2, 9], np.int32)
  rank = [2, 3, 3]
  projection = compression.colr_projection(_SHARED_SEED, _DIM, _DIM)
  rng = np.random.default_rng(1)
  a = rng.normal(size=[3, 5, _DIM]).astype(np.float32)
  a[0, :, 2:] = 0.0  # user 0's rows lie in the row space of B[:2]
  rows = np.einsum('utr,rd->utd', a, projection.numpy())
  num_rows = np.array([5, 2, 4], np.int32)
  codec = row_codecs.Colr()

  message = codec.encode(rows, num_rows, bandwidth, None, _SHARED_SEED)
  decoded = codec.decode(message, _SHARED_SEED, _DIM)

  np.testing.assert_array_equal(message['parameter'], rank)
  # Rows in B_r's row space come back exactly, with their own A; at r_u =
  # d any rows do. Padding is zero.
  np.testing.assert_allclose(message['a'], _real(a, num_rows), atol=1e-4)
  np.testing.assert_allclose(decoded, _real(rows, num_rows), atol=1e-4)
  np.testing.assert_array_equal(
      codec.compressed(message, num_rows), [True, False, False]
  )
  # Another round's seed is another factor.
  other = codec.decode(message, np.array([5, 2], np.int64), _DIM)
  assert not np.allclose(other, decoded, atol=1e-3)
  np.testing.assert_array_equal(
      codec.message_bytes(message, num_rows, _DIM),
      [4 * 5 * 2, 4 * 2 * 3, 4 * 4 * 3],
  )


def test_only_colr_shapes_training_each_user_at_its_rank():
  # Budgets as above: r_u = 2, d, d.
  bandwidth = np.array([3, 2, 9], np.int32)
  num_rows = np.array([5, 2, 4], np.int32)
  factor = compression.colr_round_factor(_SHARED_SEED, _DIM)

  maps = row_codecs.Colr().training_gradient_map(
      num_rows, bandwidth, _DIM, _SHARED_SEED
  )

  np.testing.assert_allclose(
      maps[0], compression.colr_gradient_map(factor[:2]), atol=1e-5
  )
  np.testing.assert_allclose(maps[1:], np.stack([np.eye(_DIM)] * 2),
                             atol=1e-4)
  for codec in (row_codecs.ClusteredActions(), row_codecs.TopK(),
                row_codecs.Svd()):
    assert codec.training_gradient_map(
        num_rows, bandwidth, _DIM, _SHARED_SEED
    ) is None


def test_a_user_within_its_bandwidth_round_trips_when_its_rows_fit():
  """T_u <= e_u: FedRAS sends the rows as they are, for 4 T_u d + T_u
  index bytes. CoLR at r_u = d costs 4 T_u d and is exact for any rows.
  Top-k and svd cannot be exact on dense rows within that budget (all d
  entries cost T_u d (4 + index_bytes(d)); rank T_u, 4 T_u (T_u + d)), so
  they are exact only on rows that fit their k_u or r_u."""
  dim = _HAND_DIM
  num_rows = np.array([2, 1], np.int32)  # Both within e_u = 2: B_u 34, 17.
  bandwidth = np.array([2, 2], np.int32)
  rng = np.random.default_rng(4)
  dense = rng.normal(size=[2, 2, dim]).astype(np.float32)
  dense[1, 1] = 0.0  # user 1's padding
  # Top-k: k_u = 3 (34 // 10, 17 // 5): rows with a zero entry fit.
  sparse = dense.copy()
  sparse[..., 3] = 0.0
  # Svd: r_u = 1 (34 // 24; and 17 // 20, raised to 1 = T_u): rank-1 rows.
  low_rank = dense.copy()
  low_rank[0, 1] = -2.0 * low_rank[0, 0]
  # `compressed` goes by the parameter, not the rows: top-k at k_u < d
  # and svd at r_u < T_u count as lossy even where these rows fit.
  cases = [
      (row_codecs.TopK(), sparse, [True, True]),
      (row_codecs.Svd(), low_rank, [True, False]),
      (row_codecs.Colr(), dense, [False, False]),
  ]
  for codec, rows, compressed in cases:
    message = codec.encode(rows, num_rows, bandwidth, None, _SHARED_SEED)
    np.testing.assert_allclose(
        codec.decode(message, _SHARED_SEED, dim), rows, atol=1e-5,
        err_msg=codec.scheme,
    )
    np.testing.assert_array_equal(
        codec.compressed(message, num_rows), compressed
    )
  # Dense rows do not fit top-k's k_u = 3.
  top_k = row_codecs.TopK()
  message = top_k.encode(dense, num_rows, bandwidth, None, _SHARED_SEED)
  assert not np.allclose(top_k.decode(message, _SHARED_SEED, dim), dense)


@pytest.mark.parametrize(
    'codec',
    [row_codecs.ClusteredActions(), row_codecs.TopK(), row_codecs.Svd(),
     row_codecs.Colr()],
    ids=lambda codec: codec.scheme,
)
def test_codecs_trace_in_graph_mode_with_unknown_sizes(codec):
  spec = (
      tf.TensorSpec([None, None, _DIM], tf.float32),
      tf.TensorSpec([None], tf.int32),
      tf.TensorSpec([None], tf.int32),
      tf.TensorSpec([None, 2], tf.int64),
  )

  @tf.function(input_signature=spec)
  def round_trip(rows, num_rows, bandwidth, seeds):
    message = codec.encode(rows, num_rows, bandwidth, seeds, _SHARED_SEED)
    return (
        codec.decode(message, _SHARED_SEED, _DIM),
        codec.message_bytes(message, num_rows, _DIM),
    )

  rows, num_rows = _group()
  bandwidth = np.array([9, 9, 9], np.int32)
  decoded, sent = round_trip(rows, num_rows, bandwidth, _SEEDS)
  eager = codec.encode(rows, num_rows, bandwidth, _SEEDS, _SHARED_SEED)
  np.testing.assert_allclose(
      decoded, codec.decode(eager, _SHARED_SEED, _DIM), atol=1e-5
  )
  np.testing.assert_array_equal(
      sent, codec.message_bytes(eager, num_rows, _DIM)
  )
  if codec.scheme == 'fedras':
    np.testing.assert_array_equal(decoded, _real(rows, num_rows))
  # Called again with other sizes, the same trace serves.
  decoded, _ = round_trip(
      rows[:2, :3], np.array([3, 1], np.int32), bandwidth[:2], _SEEDS[:2]
  )
  assert decoded.shape == (2, 3, _DIM)
