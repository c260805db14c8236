"""Compressed item-gradient messages of FedRAS and its baselines, in bytes.

FedRAS (Lu et al. KDD 2025) compares, at equal compression rates
CR = 1 - cost_current / cost_original (Sec. 5.1), four ways to send an item
gradient matrix G [n, d] (n rows of the item table, width d):

  top_k   "only the top-k gradient values (per row) ... are transmitted"
          (Sec. 5.1, Topk): per row the k entries largest in magnitude,
          as k values and k column indices.
  svd     a rank-r truncated SVD (Sec. 5.1, SVD): U_r S_r [n, r] and
          V_r^T [r, d].
  colr    CoLR (Nguyen et al. WWW 2024): the update is A B with B [r, d]
          drawn afresh each round from a seed the server and clients
          share, so only A [n, r] travels.
  fedras  clustered actions (Sec. 4.2, `action_clustering`): m centroids
          [m, d] and one group index per row.

Byte accounting, one rule for all: a float32 value is 4 bytes; an index is
stored in the smallest of 1, 2 or 4 unsigned bytes that holds all its
possible values (`index_bytes`), because that is the honest cost of an
index on the wire and because at the paper's rates a 4-byte index would
not fit at all: for d = 32 an int32 index per row is 4 / (4 * 32) = 3.1%
of the dense matrix, the whole budget at CR = 96.88%. Tensors in memory
still carry int32 indices (what TF's gather and scatter take). A top-k
column index takes d values; a FedRAS group index m + 1 (the m groups and
-1 for a row that is not sent, see `action_clustering`). The CoLR seed is
not counted: it is agreed once, not sent with each message. Which rows of
the item table a message covers is the caller's business (all of them for
the download, the rows of the client's items for an upload) and is not
counted either; the dense cost is 4 n d bytes for the same n rows.

The paper itself omits the FedRAS indices ("their contribution ... is
negligible", Sec. 5.1) and sets C_e = N (1 - CR); we count them, so the
`pick_parameter` group count is somewhat lower, e.g. 203 instead of
231.6 for ML-1M (N = 3706, d = 32) at CR = 93.75%.

The item-participation-normalised aggregation of Sec. 4.4 closes the
module: it is how the server combines the clients' decoded FedRAS (and,
per item, CoLR) uploads.
"""

import collections

import tensorflow as tf

FLOAT_BYTES = 4

TopKMessage = collections.namedtuple('TopKMessage', ['values', 'indices'])
TopKMessage.__doc__ = """Per-row top-k of a [n, d] matrix.

Fields:
  values: float32 [n, k], each row's kept entries, largest magnitude first.
  indices: int32 [n, k], their columns in [0, d).
"""

LowRankMessage = collections.namedtuple('LowRankMessage', ['left', 'right'])
LowRankMessage.__doc__ = """A rank-r factorisation left @ right of [n, d].

Fields:
  left: float32 [n, r], U_r S_r.
  right: float32 [r, d], V_r^T.
"""


def index_bytes(num_values: int) -> int:
  """Bytes of an unsigned index taking num_values values: 1, 2 or 4.

  Example: a column index of a width-32 row takes 32 values: 1 byte; a
  group index over 300 groups and "not sent" takes 301 values: 2 bytes.
  """
  if num_values < 1:
    raise ValueError(f'num_values must be >= 1; got {num_values}.')
  for width in (1, 2):
    if num_values <= 2 ** (8 * width):
      return width
  return 4


def dense_bytes(num_rows: int, dim: int) -> int:
  """cost_original of Sec. 5.1: the float32 matrix [num_rows, dim]."""
  return FLOAT_BYTES * num_rows * dim


def _top_k_bytes(num_rows: int, dim: int, k: int) -> int:
  return num_rows * k * (FLOAT_BYTES + index_bytes(dim))


def _svd_bytes(num_rows: int, dim: int, rank: int) -> int:
  return FLOAT_BYTES * rank * (num_rows + dim)


def _colr_bytes(num_rows: int, dim: int, rank: int) -> int:
  del dim  # B [rank, dim] is regenerated from the shared seed.
  return FLOAT_BYTES * num_rows * rank


def _fedras_bytes(num_rows: int, dim: int, num_actions: int) -> int:
  return FLOAT_BYTES * num_actions * dim + num_rows * index_bytes(
      num_actions + 1
  )


_Scheme = collections.namedtuple('_Scheme', ['bytes', 'max_parameter'])

# Each scheme's message size and the largest parameter worth sending: past
# it the message only grows (top-k of all d entries, rank d) or, for
# FedRAS, one action per row is already lossless.
_SCHEMES = {
    'top_k': _Scheme(_top_k_bytes, lambda num_rows, dim: dim),
    'svd': _Scheme(_svd_bytes, lambda num_rows, dim: min(num_rows, dim)),
    'colr': _Scheme(_colr_bytes, lambda num_rows, dim: dim),
    'fedras': _Scheme(_fedras_bytes, lambda num_rows, dim: num_rows),
}
SCHEMES = tuple(_SCHEMES)


def _scheme(name: str) -> _Scheme:
  if name not in _SCHEMES:
    raise ValueError(f'Unknown scheme {name!r}; expected one of {SCHEMES}.')
  return _SCHEMES[name]


def encoded_bytes(scheme: str, num_rows: int, dim: int, parameter: int) -> int:
  """Exact bytes of one `scheme` message for a [num_rows, dim] matrix.

  parameter is k for 'top_k', the rank for 'svd' and 'colr', the number of
  actions (groups) for 'fedras'; it lies in [1, max] where max is d for
  top_k and colr, min(n, d) for svd, n for fedras.

    top_k:  n k (4 + index_bytes(d))
    svd:    4 r (n + d)
    colr:   4 n r
    fedras: 4 m d + n index_bytes(m + 1)

  Example: n = 3706, d = 32: top_k k = 2 is 3706 * 2 * 5 = 37,060 bytes;
  fedras m = 203 is 4 * 203 * 32 + 3706 * 1 = 29,690 bytes, against a
  dense 474,368.
  """
  spec = _scheme(scheme)
  if num_rows < 1 or dim < 1:
    raise ValueError(
        f'num_rows and dim must be >= 1; got {num_rows} and {dim}.'
    )
  largest = spec.max_parameter(num_rows, dim)
  if not 1 <= parameter <= largest:
    raise ValueError(
        f'The {scheme} parameter must lie in [1, {largest}] for a '
        f'[{num_rows}, {dim}] matrix; got {parameter}.'
    )
  return spec.bytes(num_rows, dim, parameter)


def compression_rate(
    scheme: str, num_rows: int, dim: int, parameter: int
) -> float:
  """CR = 1 - encoded_bytes / dense_bytes (Sec. 5.1); larger is smaller."""
  return 1.0 - encoded_bytes(scheme, num_rows, dim, parameter) / dense_bytes(
      num_rows, dim
  )


def pick_parameter(scheme: str, num_rows: int, dim: int, rate: float) -> int:
  """The parameter whose measured CR is closest to `rate`.

  Searches every valid parameter; on a tie the smaller one (the smaller
  message). The step between parameters bounds how close it can get: a
  top-k step is 5 / (4 d) of the rate for d <= 256 (15.6 points for d = 8,
  3.9 for d = 32), an svd or colr step about 1 / d.

  Example: n = 3706, d = 32, rate 0.9375: svd and colr give rank 2 (CR
  0.9370 and exactly 0.9375), top_k k = 2 (CR 1 - 10 / 128 = 0.9219, the
  closer of 0.9219 and k = 1's 0.9609), fedras 203 groups (CR 0.93741).
  """
  if not 0.0 <= rate < 1.0:
    raise ValueError(f'rate must lie in [0, 1); got {rate!r}.')
  largest = _scheme(scheme).max_parameter(num_rows, dim)
  return min(
      range(1, largest + 1),
      key=lambda p: abs(compression_rate(scheme, num_rows, dim, p) - rate),
  )


def top_k_encode(rows: tf.Tensor, k) -> TopKMessage:
  """Keeps each row's k entries of largest magnitude (Sec. 5.1, Topk).

  Among equal magnitudes the lower column wins (tf.math.top_k's order).

  Args:
    rows: float32 [n, d].
    k: 1 <= k <= d, an int or int32 scalar tensor.
  """
  rows = tf.convert_to_tensor(rows, tf.float32)
  indices = tf.math.top_k(tf.abs(rows), k).indices
  return TopKMessage(tf.gather(rows, indices, batch_dims=1), indices)


def top_k_decode(message: TopKMessage, dim) -> tf.Tensor:
  """float32 [n, dim]: the kept entries in place, zeros elsewhere."""
  # Each row's indices are distinct, so every output entry sums one kept
  # value with zeros: exact.
  return tf.reduce_sum(
      tf.one_hot(message.indices, dim) * message.values[..., tf.newaxis],
      axis=-2,
  )


def svd_encode(rows: tf.Tensor, rank) -> LowRankMessage:
  """The rank-r truncated SVD of rows [n, d] (Sec. 5.1, SVD).

  rows = U S V^T; left = U_r S_r [n, r], right = V_r^T [r, d], whose
  product is the best rank-r approximation in Frobenius norm
  (Eckart-Young), and rows itself when r >= rank(rows).

  Batched too: rows [..., n, d] give left [..., n, r], right [..., r, d],
  each leading index its own SVD.

  Args:
    rows: float32 [..., n, d].
    rank: 1 <= r <= min(n, d), an int or int32 scalar tensor.
  """
  rows = tf.convert_to_tensor(rows, tf.float32)
  singular_values, left, right = tf.linalg.svd(rows, full_matrices=False)
  return LowRankMessage(
      left[..., :rank] * singular_values[..., tf.newaxis, :rank],
      tf.linalg.matrix_transpose(right[..., :rank]),
  )


def low_rank_decode(message: LowRankMessage) -> tf.Tensor:
  """float32 [n, d] = left @ right."""
  return tf.matmul(message.left, message.right)


def colr_projection(seed: tf.Tensor, rank, dim) -> tf.Tensor:
  """CoLR's fixed factor B [rank, dim] of a round, from the shared seed.

  Entries N(0, 1 / rank), so E[B^T B] = I_d. The scale enters neither
  CoLR's messages nor its training: least squares (`colr_encode`) and the
  training map (`colr_gradient_map`) depend on B's row space only. A
  fresh seed each round gives a fresh B.

  Args:
    seed: int [2], the round's stateless seed, shared by server and clients.
    rank: r >= 1.
    dim: the embedding width d.
  """
  return tf.random.stateless_normal(
      [rank, dim],
      seed,
      stddev=tf.math.rsqrt(tf.cast(rank, tf.float32)),
  )


def colr_round_factor(seed: tf.Tensor, dim) -> tf.Tensor:
  """The round's CoLR factor [d, d]: a rank-r message (an upload of rank
  r_u, the downlink's rank r) uses its first r rows, so every message of a
  round lies in the row spaces of one factor. `colr_projection` with
  rank d; its first r rows have entries N(0, 1 / d), a scale that least
  squares (`colr_encode`) does not see.

  Args:
    seed: int [2], the round's shared seed.
    dim: the embedding width d.
  """
  return colr_projection(seed, dim, dim)


def colr_encode(rows: tf.Tensor, projection: tf.Tensor) -> tf.Tensor:
  """A [n, r] minimising ||A B - rows||_F, for a given gradient.

  A = rows B^T (B B^T)^-1, the projection of each row onto B's row space.
  CoLR clients train A through the loss (`colr_gradient_map`), so their
  update already lies in that row space and this returns its A; on an
  already computed gradient it is the least-squares encoder, e.g. to
  measure a scheme's information loss (FedRAS Table 3). It returns A_0
  exactly when rows = A_0 B and B has full rank r <= d.

  Args:
    rows: float32 [n, d].
    projection: B, float32 [r, d] of rank r.
  """
  rows = tf.convert_to_tensor(rows, tf.float32)
  gram = tf.matmul(projection, projection, transpose_b=True)
  return tf.transpose(
      tf.linalg.solve(gram, tf.matmul(projection, rows, transpose_b=True))
  )


def colr_gradient_map(projection: tf.Tensor) -> tf.Tensor:
  """M [d, d]: how a CoLR client's training moves an item row.

  CoLR (Nguyen et al., WWW 2024) trains the A [n, r] of its update A B
  through the loss, B [r, d] fixed for the round. An SGD step on A, whose
  gradient is G B^T (G = dL/dQ, [n, d]), moves the rows by
  Delta A B = -lr G B^T B. The authors' public code draws B with
  orthonormal rows scaled by sqrt(d / r) (B B^T = (d / r) I_r) and scales
  A's gradient by sqrt(r / d), so a step moves the rows by -lr G M with

    M = sqrt(d / r) P,   P = B^T (B B^T)^-1 B,

  P the orthogonal projection onto B's row space: in expectation over a
  random B, a step as long as the dense step (E ||G P||^2 = (r / d)
  ||G||^2), along r directions. M depends on B through its row space only,
  so the first r rows of `colr_round_factor` give the M of an orthonormal
  factor with that row space. Training with this map
  (`local_training.train_users_locally(item_gradient_maps=...)`) keeps
  the update in B's row space, where `colr_encode` recovers A exactly.

  Args:
    projection: B, float32 [r, d] of rank r <= d.
  """
  projection = tf.convert_to_tensor(projection, tf.float32)
  rank = tf.cast(tf.shape(projection)[0], tf.float32)
  dim = tf.shape(projection)[1]
  # P is the least-squares fit of the identity's rows: P = I B^T (B B^T)^-1 B.
  orthogonal = colr_decode(
      colr_encode(tf.eye(dim), projection), projection
  )
  return tf.sqrt(tf.cast(dim, tf.float32) / rank) * orthogonal


def colr_decode(a: tf.Tensor, projection: tf.Tensor) -> tf.Tensor:
  """float32 [n, d] = A @ B, the item update of CoLR."""
  return tf.matmul(a, projection)


def normalize_by_participation(
    update_sum: tf.Tensor, participant_count: tf.Tensor
) -> tf.Tensor:
  """The item-participation-normalised aggregate, FedRAS Sec. 4.4.

  Delta q_i = 1/|S_t| sum_u Delta q_i^u * |S_t| / |S^i|
            = sum_u Delta q_i^u / |S^i|,
  the mean over the |S^i| clients that trained item i rather than over all
  |S_t| clients of the round; an item no client trained stays 0.

  Args:
    update_sum: float32 [I, d], sum over clients of their item updates.
    participant_count: [I], |S^i|, how many clients trained each item.

  Returns:
    float32 [I, d].
  """
  count = tf.cast(participant_count, tf.float32)[:, tf.newaxis]
  return tf.math.divide_no_nan(
      tf.convert_to_tensor(update_sum, tf.float32), count
  )


def item_participation_mean(
    updates: tf.Tensor, participation: tf.Tensor
) -> tf.Tensor:
  """Sec. 4.4's aggregate of stacked client updates [U, I, d].

  A client's row counts only where it trained the item, so a decoder's
  non-zero output on other rows does not leak into the mean.

  Example: two clients with rows [[2], [4]] and [[6], [0]], the second
  training only item 0: item 0 gets (2 + 6) / 2 = 4, item 1 gets 4 / 1.

  Args:
    updates: float32 [U, I, d].
    participation: [U, I] bool or 0/1, whether client u trained item i.
  """
  weights = tf.cast(participation, tf.float32)
  return normalize_by_participation(
      tf.reduce_sum(
          tf.convert_to_tensor(updates, tf.float32)
          * weights[..., tf.newaxis],
          axis=0,
      ),
      tf.reduce_sum(weights, axis=0),
  )


def scatter_rows(
    rows: tf.Tensor, num_rows: tf.Tensor, row_ids: tf.Tensor, num_items: int
) -> tuple[tf.Tensor, tf.Tensor]:
  """Sums U users' item rows into the table: (update_sum, participants).

  Args:
    rows: float32 [U, T, d]; user u's first num_rows[u] rows are real, the
      rest padding (ignored).
    num_rows: int32 [U], T_u.
    row_ids: int32 [U, T], the item of each row.
    num_items: N.

  Returns:
    update_sum float32 [N, d], the sum over users of their rows of each
    item, and participants float32 [N], |S^i|, how many users sent item i:
    the inputs of `normalize_by_participation`.
  """
  real = tf.sequence_mask(num_rows, tf.shape(row_ids)[1])
  ids = tf.boolean_mask(row_ids, real)[:, tf.newaxis]
  values = tf.boolean_mask(tf.convert_to_tensor(rows, tf.float32), real)
  dim = values.shape[-1]
  return (
      tf.scatter_nd(ids, values, [num_items, dim]),
      tf.scatter_nd(
          ids, tf.ones([tf.shape(ids)[0]], tf.float32), [num_items]
      ),
  )

