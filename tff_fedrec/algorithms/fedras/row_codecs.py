"""Upload codecs of FedRAS and its baselines, batched over a group of users.

FedRAS (Lu et al. KDD 2025) compares four ways for a client to upload its
item-gradient rows (Sec. 4.2 and the baselines of Sec. 5.1; the encoders
themselves are in `action_clustering` and `compression`):

  ClusteredActions  FedRAS, Alg. 1 lines 26-29: the rows as they are if
                    there are at most e_u of them, else e_u k-means actions,
                    plus one group index per row.
  TopK              each row's k_u largest-magnitude entries.
  Svd               the rank-r_u truncated SVD of the rows.
  Colr              A [n, r_u] with rows ~ A B, B [r_u, d] drawn from a
                    seed the server and the clients share each round.

The baselines' uploads get FedRAS's per-user byte budget: user u's k_u or
r_u is the largest whose message fits in B_u = `encoded_bytes('fedras',
T_u, d, min(T_u, e_u))`, the size of its FedRAS message (`upload_budget`,
`budget_parameter`), so all four upload about the same bytes for the same
users and measured uplink rates can be compared. The paper states one
rate for all methods (Sec. 5.1) and no per-user rule for the baselines; a
k or rank picked once for the whole [N, d] table
(`compression.pick_parameter`, still the baselines' downlink)
spends, on the T_u rows a user uploads, about a third of FedRAS's bytes
(uplink CR 0.98 against 0.943 on ML-100K at a requested 0.9375).

One TFF client simulates a group of U users (`templates/user_groups`), and
every user is a device with its own message, so a codec works on the group:

  rows      float32 [U, T, d]  user u's rows are the first num_rows[u] (the
                               T_u items it trained, Alg. 1 line 25: Delta
                               Q_u is zero on every other item); the rest
                               is padding, masked out before encoding;
  num_rows  int32 [U]          T_u;
  bandwidth int32 [U]          e_u, the user's FedRAS bandwidth in rows.

Every codec has the same five methods:

  encode(rows, num_rows, bandwidth, seeds, shared_seed) -> message
      the group's messages, an `OrderedDict` of tensors with a leading [U];
      seeds int64 [U, 2] is each user's seed, shared_seed int64 [2] the
      round's (each codec reads what it needs);
  decode(message, shared_seed, dim) -> float32 [U, T, d]
      the rows the server reconstructs, zero on padding;
  message_bytes(message, num_rows, dim) -> int64 [U]
      each user's message under `compression.encoded_bytes` with
      n = T_u rows and the user's own parameter: the ids of the T_u items
      are not counted (the module docstring there says why), and an empty
      message (T_u = 0) is 0 bytes;
  compressed(message, num_rows) -> bool [U]
      whether the user's rows were sent lossily;
  training_gradient_map(num_rows, bandwidth, dim, shared_seed)
      -> float32 [U, d, d] or None
      how the scheme shapes the user's training before it encodes
      (`local_training.train_users_locally(item_gradient_maps=...)`): None
      for every scheme but CoLR, which trains in its round's subspace.

Everything is graph-mode TensorFlow without `tff.*`, so it runs inside a
`tff.tensorflow.computation` as well as eagerly.
"""

import collections
import tensorflow as tf

from tff_fedrec import clustering
from tff_fedrec.algorithms.fedras import action_clustering
from tff_fedrec.algorithms.fedras import compression


def index_bytes(num_values) -> tf.Tensor:
  """int64: `compression.index_bytes` of tensors, elementwise."""
  values = tf.cast(num_values, tf.int64)
  one, two, four = (tf.constant(width, tf.int64) for width in (1, 2, 4))
  return tf.where(values <= 2**8, one, tf.where(values <= 2**16, two, four))


def encoded_bytes(scheme: str, num_rows, dim: int, parameter) -> tf.Tensor:
  """int64: `compression.encoded_bytes` of tensors, elementwise.

  num_rows and parameter are int tensors of one shape (or broadcastable);
  dim is the Python width d. Unlike the Python function this one takes
  num_rows = 0 (an empty message, 0 bytes when the parameter is 0 too, as
  every codec here sends it) and does not check the parameter's range.

    top_k:  n k (4 + index_bytes(d))
    svd:    4 r (n + d)
    colr:   4 n r
    fedras: 4 m d + n index_bytes(m + 1)
  """
  if scheme not in compression.SCHEMES:
    raise ValueError(
        f'Unknown scheme {scheme!r}; expected one of '
        f'{compression.SCHEMES}.'
    )
  n = tf.cast(num_rows, tf.int64)
  p = tf.cast(parameter, tf.int64)
  float_bytes = compression.FLOAT_BYTES
  if scheme == 'top_k':
    return n * p * (float_bytes + compression.index_bytes(dim))
  if scheme == 'svd':
    return float_bytes * p * (n + dim)
  if scheme == 'colr':
    return float_bytes * n * p
  return float_bytes * p * dim + n * index_bytes(p + 1)


def _masked(rows: tf.Tensor, num_rows: tf.Tensor) -> tf.Tensor:
  """rows [U, T, d] with every row past num_rows[u] set to zero."""
  rows = tf.convert_to_tensor(rows, tf.float32)
  mask = tf.sequence_mask(num_rows, tf.shape(rows)[1], tf.float32)
  return rows * mask[..., tf.newaxis]


def _width(rows) -> int:
  dim = rows.shape[-1]
  if dim is None:
    raise ValueError('The row width d must be known when tracing.')
  return int(dim)


class ClusteredActions:
  """FedRAS's upload, Alg. 1 lines 26-29 (`action_clustering.encode_actions`).

  User u's rows are clustered into e_u = bandwidth[u] actions by k-means
  (seeded by seeds[u]) if it has more than e_u non-zero rows, else sent as
  they are. The message of the group:

    actions      float32 [U, M, d]  user u's codebook in its first
                                    num_actions[u] rows, zero after;
                                    M = min(T, max_u e_u);
    num_actions  int32 [U]          m_u, the codebook size;
    action_index int32 [U, T]       row t decodes to actions[u, index];
                                    -1 (padding or a zero row) to zero;
    compressed   bool [U]           whether u's rows were clustered.

  Bytes: 4 m_u d + T_u index_bytes(m_u + 1).

  Example: with e_u = 1, rows [[1, 0], [0, 3]] become one action [0.5,
  1.5] with action_index [0, 0]: 4 * 1 * 2 + 2 * 1 = 10 bytes.
  """

  scheme = 'fedras'

  def __init__(
      self, num_iterations: int = clustering.DEFAULT_LLOYD_ITERATIONS
  ):
    self._num_iterations = num_iterations

  def encode(self, rows, num_rows, bandwidth, seeds, shared_seed):
    """Messages of the group (class docstring); shared_seed is unused.
    Each user clusters its own T_u rows, not the group's padding: k-means
    costs time in proportion to the rows, and a group's T is its largest
    T_u."""
    del shared_seed
    dim = _width(rows)
    num_slots = tf.minimum(tf.shape(rows)[1], tf.reduce_max(bandwidth))
    padding = tf.shape(rows)[1] - num_rows

    def one_user(args):
      user_rows, count, user_padding, user_bandwidth, seed = args
      message = action_clustering.encode_actions(
          user_rows[:count], user_bandwidth, seed,
          num_iterations=self._num_iterations,
      )
      actions = message.actions
      padded = tf.pad(
          actions, [[0, num_slots - tf.shape(actions)[0]], [0, 0]]
      )
      index = tf.pad(
          message.action_index, [[0, user_padding]], constant_values=-1
      )
      return padded, tf.shape(actions)[0], index, message.compressed

    actions, counts, index, compressed = tf.map_fn(
        one_user,
        (rows, num_rows, padding, tf.cast(bandwidth, tf.int32), seeds),
        fn_output_signature=(
            tf.TensorSpec([None, dim], tf.float32),
            tf.TensorSpec([], tf.int32),
            tf.TensorSpec([None], tf.int32),
            tf.TensorSpec([], tf.bool),
        ),
    )
    return collections.OrderedDict(
        actions=actions,
        num_actions=counts,
        action_index=index,
        compressed=compressed,
    )

  def decode(self, message, shared_seed, dim: int):
    del shared_seed
    return tf.map_fn(
        lambda args: action_clustering.decode_actions(*args),
        (message['actions'], message['action_index']),
        fn_output_signature=tf.TensorSpec([None, dim], tf.float32),
    )

  def message_bytes(self, message, num_rows, dim: int):
    return encoded_bytes(self.scheme, num_rows, dim, message['num_actions'])

  def compressed(self, message, num_rows):
    del num_rows
    return message['compressed']

  def training_gradient_map(self, num_rows, bandwidth, dim, shared_seed):
    """None: clients train the dense rows and cluster the update."""
    del num_rows, bandwidth, dim, shared_seed
    return None


BASELINES = ('top_k', 'svd', 'colr')


def upload_budget(num_rows, bandwidth, dim: int) -> tf.Tensor:
  """int64 [U]: B_u, the bytes of FedRAS's upload for each user.

  B_u = `encoded_bytes('fedras', T_u, d, min(T_u, e_u))`
      = 4 min(T_u, e_u) d + T_u index_bytes(min(T_u, e_u) + 1),
  what `ClusteredActions` sends when none of the T_u rows is zero (a zero
  row is not sent, so FedRAS may send less, never more); 0 for T_u = 0.

  Example: d = 4, e_u = 2: T_u = 5 gives 4 * 2 * 4 + 5 * 1 = 37 bytes,
  T_u = 2 gives 4 * 2 * 4 + 2 * 1 = 34.

  Args:
    num_rows: int [U], T_u.
    bandwidth: int [U], e_u.
    dim: the Python width d.
  """
  num_rows = tf.cast(num_rows, tf.int32)
  actions = tf.minimum(num_rows, tf.cast(bandwidth, tf.int32))
  return encoded_bytes('fedras', num_rows, dim, actions)


def lossless_parameter(scheme: str, num_rows, dim: int) -> tf.Tensor:
  """int32: a baseline's largest parameter, at which it sends rows exactly.

  d for 'top_k' (every entry) and 'colr' (B [d, d] is square and, drawn
  from a normal, invertible), min(T_u, d) for 'svd' (the rows' full rank):
  the top of `compression.encoded_bytes`'s range, past which a
  message only grows.
  """
  if scheme not in BASELINES:
    raise ValueError(f'Unknown scheme {scheme!r}; expected one of {BASELINES}.')
  num_rows = tf.cast(num_rows, tf.int32)
  if scheme == 'svd':
    return tf.minimum(num_rows, dim)
  return tf.fill(tf.shape(num_rows), tf.constant(dim, tf.int32))


def budget_parameter(scheme: str, num_rows, dim: int, budget) -> tf.Tensor:
  """int32 [U]: each user's k or rank p_u, the largest its budget pays for.

  p_u = max {p in [1, P_u] : encoded_bytes(scheme, T_u, d, p) <= B_u},
  P_u = `lossless_parameter`. A baseline's bytes are p times a cost c_u
  per unit of p, so p_u = clip(floor(B_u / c_u), 1, P_u) with

    top_k  c_u = T_u (4 + index_bytes(d))
    svd    c_u = 4 (T_u + d)
    colr   c_u = 4 T_u

  If even p = 1 costs more than B_u the user sends p = 1, over its
  budget, rather than drop its update: with FedRAS's budget that takes
  e_u d well below T_u (e.g. e_u = 1, T_u > d for top_k) or, for svd,
  T_u = 1 (4 (1 + d) against 4 d + 1). At the paper's settings (d = 32,
  e_u = 92 on ML-100K) every T_u <= N = 1,682 is within budget (top_k up
  to T_u = 2,944, where 5 T_u = 11,776 + T_u). A user with T_u = 0 sends
  nothing: p_u = 0.

  Example: d = 4, T_u = 5, e_u = 2 (B_u = 37 bytes, `upload_budget`):
  top_k k = floor(37 / 25) = 1, svd r = floor(37 / 36) = 1, colr r =
  floor(37 / 20) = 1; with e_u = 3 (B_u = 53): 2, 1 and 2.

  Args:
    scheme: 'top_k', 'svd' or 'colr'.
    num_rows: int [U], T_u.
    dim: the Python width d.
    budget: int [U], B_u in bytes.
  """
  largest = lossless_parameter(scheme, num_rows, dim)
  num_rows = tf.cast(num_rows, tf.int64)
  # The cost of an empty user is never used; 1 row keeps the division sane.
  rows = tf.maximum(num_rows, 1)
  float_bytes = compression.FLOAT_BYTES
  if scheme == 'top_k':
    unit = rows * (float_bytes + compression.index_bytes(dim))
  elif scheme == 'svd':
    unit = float_bytes * (rows + dim)
  else:
    unit = float_bytes * rows
  affordable = tf.cast(budget, tf.int64) // unit
  parameter = tf.clip_by_value(affordable, 1, tf.cast(largest, tf.int64))
  return tf.cast(tf.where(num_rows > 0, parameter, 0), tf.int32)


class _BudgetedCodec:
  """A baseline whose user u sends at the parameter p_u its FedRAS budget
  pays for (`upload_budget`, `budget_parameter`).

  Its message carries, besides the scheme's tensors,

    parameter   int32 [U]  p_u (k_u or r_u), 0 for T_u = 0;
    compressed  bool [U]   whether p_u is below `lossless_parameter`,
                           i.e. the scheme may have lost something (rows
                           sparse or low-rank enough can still come back
                           exactly).
  """

  scheme = None

  def parameters(self, num_rows, bandwidth, dim: int) -> tf.Tensor:
    """int32 [U]: p_u of each user with T_u rows and bandwidth e_u."""
    return budget_parameter(
        self.scheme, num_rows, dim, upload_budget(num_rows, bandwidth, dim)
    )

  def _message(self, fields, parameter, num_rows, dim: int):
    lossy = parameter < lossless_parameter(self.scheme, num_rows, dim)
    return collections.OrderedDict(
        **fields,
        parameter=parameter,
        compressed=tf.logical_and(tf.convert_to_tensor(num_rows) > 0, lossy),
    )

  def message_bytes(self, message, num_rows, dim: int):
    return encoded_bytes(self.scheme, num_rows, dim, message['parameter'])

  def compressed(self, message, num_rows):
    del num_rows
    return message['compressed']

  def training_gradient_map(self, num_rows, bandwidth, dim, shared_seed):
    """None: Top-K and SVD compress an update trained in full."""
    del num_rows, bandwidth, dim, shared_seed
    return None


class TopK(_BudgetedCodec):
  """Per-row top-k (Sec. 5.1, Topk) at each user's k_u.

  values float32 [U, T, K] and indices int32 [U, T, K], K = max_u k_u:
  each of user u's rows keeps its k_u largest-magnitude entries in its
  first k_u slots; the other slots hold value 0 and index -1, which decode
  to nothing. Bytes: T_u k_u (4 + index_bytes(d)).

  Example: d = 4, e_u = 2, T_u = 5: B_u = 37 bytes buys k_u = 1, 25
  bytes; each row keeps its largest-magnitude entry.
  """

  scheme = 'top_k'

  def encode(self, rows, num_rows, bandwidth, seeds, shared_seed):
    """Messages of the group (class docstring); the seeds are unused."""
    del seeds, shared_seed
    rows = _masked(rows, num_rows)
    dim = _width(rows)
    k = self.parameters(num_rows, bandwidth, dim)
    width = tf.maximum(tf.reduce_max(k), 0)
    # top_k sorts by magnitude, so a user's first k_u of the group's K
    # slots are its own top k_u.
    message = compression.top_k_encode(
        tf.reshape(rows, [-1, dim]), width
    )
    kept = tf.concat([tf.shape(rows)[:2], [width]], axis=0)
    sent = tf.sequence_mask(k, width)[:, tf.newaxis, :]
    return self._message(
        dict(
            values=tf.where(sent, tf.reshape(message.values, kept), 0.0),
            indices=tf.where(sent, tf.reshape(message.indices, kept), -1),
        ),
        k, num_rows, dim,
    )

  def decode(self, message, shared_seed, dim: int):
    del shared_seed
    # tf.one_hot of index -1 is zero: an unsent slot adds nothing.
    return compression.top_k_decode(
        compression.TopKMessage(message['values'], message['indices']),
        dim,
    )


class Svd(_BudgetedCodec):
  """Each user's truncated SVD (Sec. 5.1, SVD) at its rank r_u.

  left float32 [U, T, R] = U_r S_r and right [U, R, d] = V_r^T, R = max_u
  r_u, with user u's columns (rows) r_u and beyond zero. Its padding rows
  are zero, so the SVD of its [T, d] block is that of its T_u real rows
  (`compression.svd_encode`, batched). Bytes: 4 r_u (T_u + d).

  Example: d = 4, e_u = 3, T_u = 5: B_u = 53 bytes buys r_u = 1, 36 bytes.
  """

  scheme = 'svd'

  def encode(self, rows, num_rows, bandwidth, seeds, shared_seed):
    """Messages of the group (class docstring); the seeds are unused."""
    del seeds, shared_seed
    rows = _masked(rows, num_rows)
    dim = _width(rows)
    rank = self.parameters(num_rows, bandwidth, dim)
    width = tf.maximum(tf.reduce_max(rank), 0)
    message = compression.svd_encode(rows, width)
    sent = tf.sequence_mask(rank, width, tf.float32)
    # U's padding rows are zero only up to round-off; make them exact.
    real = tf.sequence_mask(num_rows, tf.shape(rows)[1], tf.float32)
    return self._message(
        dict(
            left=message.left * sent[:, tf.newaxis, :]
            * real[..., tf.newaxis],
            right=message.right * sent[..., tf.newaxis],
        ),
        rank, num_rows, dim,
    )

  def decode(self, message, shared_seed, dim: int):
    del shared_seed, dim
    return compression.low_rank_decode(
        compression.LowRankMessage(message['left'], message['right'])
    )


class Colr(_BudgetedCodec):
  """CoLR's upload (Nguyen et al. WWW 2024) at each user's rank r_u.

  B = `compression.colr_round_factor(shared_seed, d)` [d, d] is
  the round's fixed factor, regenerated by the server from the same seed
  (the downlink uses its first rows too). User u trains A_u [T, r_u]
  through the loss on B's first r_u rows B_r: its item-row gradients are
  mapped into B_r's row space (`training_gradient_map`,
  `compression.colr_gradient_map`), so its update is A_u B_r,
  and `encode` recovers A_u from it by least squares (`colr_encode`; on
  rows outside that space, e.g. an information-loss measurement, it is
  their orthogonal projection). It sends A_u padded with zero columns: a
  float32 [U, T, R], R = max_u r_u, decoded as A_u B (a zero column adds
  nothing). Bytes: 4 T_u r_u.

  B's scale does not matter: the map and the least-squares fit depend on
  B_r's row space only, the same for c B_r and any c != 0, and that row
  space (r_u rows of i.i.d. normals) is distributed as a fresh rank-r_u
  factor's. At r_u = d, B is square and invertible with probability 1:
  the map is the identity and the rows come back exactly.

  Example: d = 4, e_u = 2: T_u = 5 (B_u = 37 bytes) buys r_u = 1, 20
  bytes; T_u = 2 (B_u = 34) buys r_u = 4 = d, 32 bytes, and is exact.
  """

  scheme = 'colr'

  def encode(self, rows, num_rows, bandwidth, seeds, shared_seed):
    """Messages of the group (class docstring); seeds are unused."""
    del seeds
    rows = _masked(rows, num_rows)
    dim = _width(rows)
    rank = self.parameters(num_rows, bandwidth, dim)
    # An empty user's zero rows fit A = 0 at any rank; rank 1 keeps its
    # solve non-empty.
    fit_rank = tf.maximum(rank, 1)
    width = tf.reduce_max(fit_rank)
    projection = compression.colr_round_factor(shared_seed, dim)

    def one_user(args):
      user_rows, user_rank = args
      a = compression.colr_encode(user_rows, projection[:user_rank])
      return tf.pad(a, [[0, 0], [0, width - user_rank]])

    a = tf.map_fn(
        one_user, (rows, fit_rank),
        fn_output_signature=tf.TensorSpec([None, None], tf.float32),
    )
    return self._message(dict(a=a), rank, num_rows, dim)

  def training_gradient_map(self, num_rows, bandwidth, dim, shared_seed):
    """float32 [U, d, d]: user u's `colr_gradient_map` of B's first r_u rows
    (rank at least 1, as in `encode`)."""
    rank = tf.maximum(self.parameters(num_rows, bandwidth, dim), 1)
    factor = compression.colr_round_factor(shared_seed, dim)
    return tf.map_fn(
        lambda user_rank: compression.colr_gradient_map(
            factor[:user_rank]
        ),
        rank,
        fn_output_signature=tf.TensorSpec([dim, dim], tf.float32),
    )

  def decode(self, message, shared_seed, dim: int):
    a = message['a']
    projection = compression.colr_round_factor(shared_seed, dim)[
        : tf.shape(a)[-1]
    ]
    return compression.colr_decode(a, projection)
