"""Upload codecs of FedRAS and its baselines, batched over a group of users.

FedRAS (Lu et al. KDD 2025) compares four ways for a client to upload its
item-gradient rows (Sec. 4.2 and the baselines of Sec. 5.1; the encoders
themselves are in `action_clustering` and `gradient_compression`):

  ClusteredActions  FedRAS, Alg. 1 lines 26-29: the rows as they are if
                    there are at most e_u of them, else e_u k-means actions,
                    plus one group index per row.
  TopK(k)           each row's k largest-magnitude entries.
  Svd(r)            the rank-r truncated SVD of the rows.
  Colr(r)           A [n, r] with rows ~ A B, B [r, d] drawn from a seed the
                    server and the clients share each round.

One TFF client simulates a group of U users (`algorithms/user_groups`), and
every user is a device with its own message, so a codec works on the group:

  rows     float32 [U, T, d]  user u's rows are the first num_rows[u] (the
                              T_u items it trained, Alg. 1 line 25: Delta
                              Q_u is zero on every other item); the rest is
                              padding, masked out before encoding;
  num_rows int32 [U]          T_u.

Every codec has the same four methods:

  encode(rows, num_rows, bandwidth, seeds, shared_seed) -> message
      the group's messages, an `OrderedDict` of tensors with a leading [U];
      bandwidth int32 [U] is e_u, seeds int64 [U, 2] each user's seed,
      shared_seed int64 [2] the round's (each codec reads what it needs);
  decode(message, shared_seed, dim) -> float32 [U, T, d]
      the rows the server reconstructs, zero on padding;
  message_bytes(message, num_rows, dim) -> int64 [U]
      each user's message under `gradient_compression.encoded_bytes` with
      n = T_u rows: the ids of the T_u items are not counted (the module
      docstring there says why), and an empty message (T_u = 0) is 0 bytes;
  compressed(message, num_rows) -> bool [U]
      whether the user's rows were sent lossily.

Everything is graph-mode TensorFlow without `tff.*`, so it runs inside a
`tff.tensorflow.computation` as well as eagerly.
"""

import collections

import tensorflow as tf

from tff_fedrec import action_clustering
from tff_fedrec import gradient_compression


def index_bytes(num_values) -> tf.Tensor:
  """int64: `gradient_compression.index_bytes` of tensors, elementwise."""
  values = tf.cast(num_values, tf.int64)
  one, two, four = (tf.constant(width, tf.int64) for width in (1, 2, 4))
  return tf.where(values <= 2**8, one, tf.where(values <= 2**16, two, four))


def encoded_bytes(scheme: str, num_rows, dim: int, parameter) -> tf.Tensor:
  """int64: `gradient_compression.encoded_bytes` of tensors, elementwise.

  num_rows and parameter are int tensors of one shape (or broadcastable);
  dim is the Python width d. Unlike the Python function this one takes
  num_rows = 0 (an empty message, 0 bytes when the parameter is 0 too, as
  every codec here sends it) and does not check the parameter's range.

    top_k:  n k (4 + index_bytes(d))
    svd:    4 r (n + d)
    colr:   4 n r
    fedras: 4 m d + n index_bytes(m + 1)
  """
  if scheme not in gradient_compression.SCHEMES:
    raise ValueError(
        f'Unknown scheme {scheme!r}; expected one of '
        f'{gradient_compression.SCHEMES}.'
    )
  n = tf.cast(num_rows, tf.int64)
  p = tf.cast(parameter, tf.int64)
  float_bytes = gradient_compression.FLOAT_BYTES
  if scheme == 'top_k':
    return n * p * (float_bytes + gradient_compression.index_bytes(dim))
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
      self, num_iterations: int = action_clustering.DEFAULT_LLOYD_ITERATIONS
  ):
    self._num_iterations = num_iterations

  def encode(self, rows, num_rows, bandwidth, seeds, shared_seed):
    """Messages of the group (class docstring); shared_seed is unused."""
    del shared_seed
    rows = _masked(rows, num_rows)
    dim = _width(rows)
    num_slots = tf.minimum(tf.shape(rows)[1], tf.reduce_max(bandwidth))
    masks = tf.sequence_mask(num_rows, tf.shape(rows)[1])

    def one_user(args):
      user_rows, mask, user_bandwidth, seed = args
      message = action_clustering.encode_actions(
          user_rows, user_bandwidth, seed, row_mask=mask,
          num_iterations=self._num_iterations,
      )
      count = tf.shape(message.actions)[0]
      padded = tf.pad(message.actions, [[0, num_slots - count], [0, 0]])
      return padded, count, message.action_index, message.compressed

    actions, counts, index, compressed = tf.map_fn(
        one_user,
        (rows, masks, tf.cast(bandwidth, tf.int32), seeds),
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


class _FixedParameterCodec:
  """A baseline whose parameter (k or rank) is the same for every user;
  it sends every user's rows lossily and ignores bandwidths."""

  scheme = None

  def __init__(self, parameter: int):
    if parameter < 1:
      raise ValueError(
          f'The {self.scheme} parameter must be positive; got {parameter}.'
      )
    self.parameter = parameter

  def compressed(self, message, num_rows):
    del message
    return tf.convert_to_tensor(num_rows) > 0


class TopK(_FixedParameterCodec):
  """Per-row top-k (Sec. 5.1, Topk): values and columns [U, T, k].

  Bytes: T_u k (4 + index_bytes(d)).
  """

  scheme = 'top_k'

  def encode(self, rows, num_rows, bandwidth, seeds, shared_seed):
    del bandwidth, seeds, shared_seed
    rows = _masked(rows, num_rows)
    dim = _width(rows)
    shape = tf.shape(rows)
    message = gradient_compression.top_k_encode(
        tf.reshape(rows, [-1, dim]), self.parameter
    )
    kept = tf.concat([shape[:2], [self.parameter]], axis=0)
    return collections.OrderedDict(
        values=tf.reshape(message.values, kept),
        indices=tf.reshape(message.indices, kept),
    )

  def decode(self, message, shared_seed, dim: int):
    del shared_seed
    return gradient_compression.top_k_decode(
        gradient_compression.TopKMessage(message['values'], message['indices']),
        dim,
    )

  def message_bytes(self, message, num_rows, dim: int):
    del message
    return encoded_bytes(self.scheme, num_rows, dim, self.parameter)


class Svd(_FixedParameterCodec):
  """Each user's rank-r truncated SVD (Sec. 5.1, SVD).

  left float32 [U, T, r'] = U_r S_r and right [U, r', d] = V_r^T with
  r' = min(r, T, d). User u sends min(r, T_u) columns (its padding rows are
  zero, so the rest are zero): bytes 4 min(r, T_u) (T_u + d).
  """

  scheme = 'svd'

  def encode(self, rows, num_rows, bandwidth, seeds, shared_seed):
    del bandwidth, seeds, shared_seed
    rows = _masked(rows, num_rows)
    dim = _width(rows)
    left, right = tf.map_fn(
        lambda user_rows: tuple(
            gradient_compression.svd_encode(user_rows, self.parameter)
        ),
        rows,
        fn_output_signature=(
            tf.TensorSpec([None, None], tf.float32),
            tf.TensorSpec([None, dim], tf.float32),
        ),
    )
    return collections.OrderedDict(left=left, right=right)

  def decode(self, message, shared_seed, dim: int):
    del shared_seed, dim
    return gradient_compression.low_rank_decode(
        gradient_compression.LowRankMessage(message['left'], message['right'])
    )

  def message_bytes(self, message, num_rows, dim: int):
    del message
    return encoded_bytes(
        self.scheme, num_rows, dim, tf.minimum(self.parameter, num_rows)
    )


class Colr(_FixedParameterCodec):
  """CoLR's upload (Nguyen et al. WWW 2024): A [U, T, r] with rows ~ A B.

  B = `gradient_compression.colr_projection(shared_seed, r, d)` is the
  round's fixed factor, regenerated by the server from the same seed; A is
  the least-squares fit `colr_encode` of the client's trained rows (CoLR
  proper trains A through the loss; see `algorithms/fedras`). Bytes:
  4 T_u r.
  """

  scheme = 'colr'

  def _projection(self, shared_seed, dim):
    return gradient_compression.colr_projection(
        shared_seed, self.parameter, dim
    )

  def encode(self, rows, num_rows, bandwidth, seeds, shared_seed):
    del bandwidth, seeds
    rows = _masked(rows, num_rows)
    dim = _width(rows)
    shape = tf.shape(rows)
    a = gradient_compression.colr_encode(
        tf.reshape(rows, [-1, dim]), self._projection(shared_seed, dim)
    )
    return collections.OrderedDict(
        a=tf.reshape(a, tf.concat([shape[:2], [self.parameter]], axis=0))
    )

  def decode(self, message, shared_seed, dim: int):
    a = message['a']
    shape = tf.shape(a)
    rows = gradient_compression.colr_decode(
        tf.reshape(a, [-1, self.parameter]), self._projection(shared_seed, dim)
    )
    return tf.reshape(rows, tf.concat([shape[:2], [dim]], axis=0))

  def message_bytes(self, message, num_rows, dim: int):
    del message
    return encoded_bytes(self.scheme, num_rows, dim, self.parameter)
