"""Information loss of compressed item updates, FedRAS Table 3 (Sec. 5.3).

FedRAS (Lu et al. KDD 2025) measures what a compression scheme loses on
each side of a round:

  client  MSE(Agg({Q_c_u : u in S}), Agg({Q_u : u in S})): the aggregate of
          the clients' decoded uploads against the aggregate of what they
          would have sent uncompressed, Agg being the server's aggregation
          (`compression.normalize_by_participation`, Sec. 4.4, for
          FedRAS; the mean over the round's users, FedAvg, for the
          baselines);
  server  MSE(Q, Q_c): the server's aggregate against what a client
          decodes from the downlink message.

Q is the item-gradient matrix for FedRAS and its baselines, and the item
embeddings for CE (clustered embeddings, the FedRAS-E ablation). The paper
does not say over which entries its mean is taken. Here it is over the
entries of the rows where either matrix is non-zero: the items trained
this round (for CE's downlink, the whole table), so rows that are zero on
both sides do not dilute it. `LossPair.relative` adds the
scale-free ||Q_c - Q||^2 / ||Q||^2, since the absolute MSE scales with the
item learning rate.

The functions take the codecs of `row_codecs` and
`algorithms.downlink_codecs`; pure TensorFlow, graph-safe.
"""

import collections

import tensorflow as tf

from tff_fedrec.algorithms.fedras import compression

NORMALIZATIONS = ('participation', 'clients')

LossPair = collections.namedtuple('LossPair', ['mse', 'relative'])
LossPair.__doc__ = """Loss of a compressed matrix against the reference.

Fields:
  mse: float32 [], mean squared difference over the entries of the rows
    where either matrix is non-zero.
  relative: float32 [], ||compressed - reference||^2 / ||reference||^2.
"""


def compression_loss(compressed: tf.Tensor, reference: tf.Tensor) -> LossPair:
  """`LossPair` of compressed [N, d] against reference [N, d]."""
  compressed = tf.convert_to_tensor(compressed, tf.float32)
  reference = tf.convert_to_tensor(reference, tf.float32)
  squared = tf.square(compressed - reference)
  rows = tf.logical_or(
      tf.reduce_any(tf.not_equal(reference, 0.0), axis=1),
      tf.reduce_any(tf.not_equal(compressed, 0.0), axis=1),
  )
  entries = tf.reduce_sum(tf.cast(rows, tf.float32)) * tf.cast(
      tf.shape(reference)[1], tf.float32
  )
  return LossPair(
      mse=tf.math.divide_no_nan(
          tf.reduce_sum(tf.boolean_mask(squared, rows)), entries
      ),
      relative=tf.math.divide_no_nan(
          tf.reduce_sum(squared), tf.reduce_sum(tf.square(reference))
      ),
  )


def normalize(
    update_sum: tf.Tensor, participants: tf.Tensor, num_users,
    normalization: str,
) -> tf.Tensor:
  """Agg of Table 3 from `compression.scatter_rows` sums: float32
  [N, d].

  'participation': each item's sum over the users that sent it (Sec. 4.4);
  'clients': over all num_users users of the round (FedAvg), as
  `clustered_actions` aggregates.
  """
  if normalization not in NORMALIZATIONS:
    raise ValueError(
        f'normalization must be one of {NORMALIZATIONS}; got '
        f'{normalization!r}.'
    )
  if normalization == 'participation':
    return compression.normalize_by_participation(
        update_sum, participants
    )
  return tf.math.divide_no_nan(
      tf.convert_to_tensor(update_sum, tf.float32),
      tf.cast(num_users, tf.float32),
  )


def decoded_uploads(
    codec, rows, num_rows, *, bandwidth, seeds, shared_seed
) -> tf.Tensor:
  """Q_c_u: float32 [U, T, d], what the server decodes from the uploads of
  U users' rows [U, T, d] under a `row_codecs` codec (its inputs as in
  `row_codecs`)."""
  rows = tf.convert_to_tensor(rows, tf.float32)
  message = codec.encode(rows, num_rows, bandwidth, seeds, shared_seed)
  return codec.decode(message, shared_seed, rows.shape[-1])


def server_loss(
    codec, payload, state, seed, bandwidth: int
) -> tuple[LossPair, object]:
  """The server-side loss of a `downlink_codecs` codec on `payload` [N, d],
  decoded by a client of bandwidth e (in rows); returns (`LossPair`, the
  encoder's next state)."""
  message, state, _ = codec.encode(payload, state, seed)
  rows, _ = codec.decode(message, tf.constant([bandwidth], tf.int32))
  return compression_loss(rows[0], payload), state
