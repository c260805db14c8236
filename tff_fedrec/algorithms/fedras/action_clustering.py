"""Action sharing: k-means on gradient rows (FedRAS, Lu et al. KDD 2025).

FedRAS Sec. 3-4.2 treats the update Delta q_i of each item embedding as an
"action" and sends, instead of every row, the centroids of a k-means
clustering of the rows (Sec. 2.1,

  argmin_{G_1..G_K} sum_k sum_{i in G_k} ||Q(i, :) - mu_k||^2,
  mu_k = mean of the rows in G_k)

plus one group index per row; the receiver decodes row i as the centroid
of its group, Enc(Delta q_i) = mu_k (Sec. 4.2).

A message here is always a codebook `actions` [m, d] and an index
`action_index` [n] into it, with -1 marking a row that is not sent (all
zero, or padding) and decodes to zero. Uncompressed and clustered uploads
then share one shape and one decoder: uncompressed, the codebook is the
sent rows themselves.

Everything here is graph-mode TensorFlow (tf.while_loop, tf.cond, no Python
branching on tensor values), so it runs inside `tff.tensorflow.computation`
as well as eagerly and under tf.function.
"""

import collections

import tensorflow as tf

from tff_fedrec import clustering

ActionMessage = collections.namedtuple(
    'ActionMessage', ['actions', 'action_index', 'compressed']
)
ActionMessage.__doc__ = """An upload of FedRAS Alg. 1 lines 26-29.

Fields:
  actions: float32 [m, d], the codebook: the sent rows themselves when not
    compressed (m = number of sent rows), else the k-means centroids
    (m = the bandwidth e_u).
  action_index: int32 [n], row i decodes to actions[action_index[i]];
    -1 for a row not sent, which decodes to zero.
  compressed: bool [], whether the rows were clustered.
"""


def sent_rows(rows: tf.Tensor, row_mask: tf.Tensor | None = None) -> tf.Tensor:
  """bool [n]: the real rows with a non-zero entry, those a client sends.

  FedRAS Alg. 1 line 26 counts NonzeroRowCount(Delta Q_u): a client only
  trains the items of its own interactions, and the others' rows are zero.
  """
  rows = tf.convert_to_tensor(rows, tf.float32)
  nonzero = tf.reduce_any(tf.not_equal(rows, 0.0), axis=1)
  return tf.logical_and(nonzero, clustering.row_weights(rows, row_mask) > 0)


def encode_actions(
    rows: tf.Tensor,
    bandwidth,
    seed: tf.Tensor,
    row_mask: tf.Tensor | None = None,
    num_iterations: int = clustering.DEFAULT_LLOYD_ITERATIONS,
) -> ActionMessage:
  """The client's upload rule, FedRAS Alg. 1 lines 26-29 and Sec. 4.2.

  If the number of sent rows (non-zero real rows) is at most the bandwidth
  e_u, they go uncompressed; else they are clustered by k-means into
  exactly e_u actions. The paper measures e_u "by the number of rows in the
  item embedding" (Sec. 4.1) and sets e_u = C_e = N (1 - CR) (Sec. 5.1),
  omitting the per-row group indices from the overhead ("their contribution
  ... is negligible. Thus, we omit this term"). So the bandwidth is spent
  on float rows only: e_u rows of d floats, plus one index per sent row
  that is not charged against it. `compression.encoded_bytes`
  does count those indices; a client whose e_u is the C_e that
  `pick_parameter('fedras', ...)` chose for the whole table sends at most
  the bytes of the server's message at that rate, since it indexes no more
  rows.

  Example: with bandwidth 2, rows [[1, 0], [0, 0], [0, 3]] are sent as they
  are: actions [[1, 0], [0, 3]], action_index [0, -1, 1], compressed
  False. With bandwidth 1 they are clustered into one action, their mean
  [0.5, 1.5], with action_index [0, -1, 0].

  Args:
    rows: float32 [n, d], the client's update Delta Q_u (all items, or the
      rows of its items), n >= 1.
    bandwidth: e_u >= 1, a Python int or int32 scalar tensor.
    seed: int [2], the stateless seed of the clustering.
    row_mask: [n] bool or 0/1, padding rows are 0; None means all are real.
    num_iterations: Lloyd steps of the clustering.

  Returns:
    An ActionMessage; `decode_actions(m.actions, m.action_index)` is the
    update the server reconstructs.
  """
  rows = tf.convert_to_tensor(rows, tf.float32)
  bandwidth = tf.convert_to_tensor(bandwidth, tf.int32)
  sent = sent_rows(rows, row_mask)
  num_sent = tf.reduce_sum(tf.cast(sent, tf.int32))
  compressed = num_sent > bandwidth

  def uncompressed_message():
    position = tf.cumsum(tf.cast(sent, tf.int32)) - 1
    return tf.boolean_mask(rows, sent), tf.where(sent, position, -1)

  def clustered_message():
    result = clustering.kmeans(rows, bandwidth, seed, sent, num_iterations)
    return result.centroids, result.assignments

  actions, action_index = tf.cond(
      compressed, clustered_message, uncompressed_message
  )
  return ActionMessage(actions, action_index, compressed)


def decode_actions(actions: tf.Tensor, action_index: tf.Tensor) -> tf.Tensor:
  """float32 [n, d]: row i is actions[action_index[i]], or 0 where it is -1.

  The receiver's reconstruction of FedRAS Sec. 4.2, Enc(Delta q_i) = mu_k.

  Args:
    actions: float32 [m, d], m >= 0.
    action_index: int32 [n], each in [-1, m).
  """
  actions = tf.convert_to_tensor(actions, tf.float32)
  # A leading zero row turns index -1 into a plain gather, also when m = 0.
  zero = tf.zeros([1, tf.shape(actions)[1]], tf.float32)
  with_zero = tf.concat([zero, actions], axis=0)
  return tf.gather(with_zero, tf.convert_to_tensor(action_index) + 1)
