"""FedRAS's compressed upload of item-gradient rows as an aggregation factory.

FedRAS (Lu et al. KDD 2025) has each client u upload its item update
Delta Q_u as actions: the non-zero rows as they are if there are at most
e_u of them (its bandwidth, in rows), else e_u k-means centroids with one
group index per row (Alg. 1 lines 26-29, Sec. 4.2). The server decodes
every upload and averages each item over the clients that trained it
(Sec. 4.4):

  Delta q_i = 1/|S_t| sum_u Delta q_i^u * |S_t| / |S^i|
            = sum_u Delta q_i^u / |S^i|.

`ClusteredActionsFactory(num_items)` is that: an
`UnweightedAggregationFactory` (each user counts once, and a TFF client
simulating U users sends U messages) whose process has the type

  initialize: ( -> <>@SERVER)
  next: (<<>@SERVER, {V}@CLIENTS> -> <state=<>@SERVER,
         result=<update=float32[N, d], participants=float32[N]>@SERVER,
         measurements=<uploaded_bytes=int64, uploaded_users=int32,
                       compressed_users=int32>@SERVER>)

with V = `upload_type(d)`, one TFF client's group of U users:

  row_ids     int32 [U, T]      user u's T_u item ids, then padding;
  num_rows    int32 [U]         T_u;
  row_values  float32 [U, T, d] its rows of Delta Q_u (padding ignored);
  bandwidth   int32 [U]         e_u;
  seeds       int64 [U, 2]      the seed of u's k-means;
  shared_seed int64 [2]         the round's seed, shared by all (CoLR).

The encoding runs in a `federated_map` at CLIENTS, so the value that
crosses to the server in `federated_aggregate` is the encoded message
(ids, actions, group indices), and the server decodes it while
accumulating. `participants[i]` is |S^i|, the users whose rows include
item i; `update` is zero where it is 0. `uploaded_bytes` sums each
user's message under `compression.encoded_bytes` (n = T_u rows,
item ids not counted); `compressed_users` counts those clustered.

The factory takes any codec of `row_codecs` (default `ClusteredActions`),
so the baselines of Sec. 5.1 (`TopK`, `Svd`, `Colr`) are aggregated and
counted the same way; and `normalization='clients'` averages over all
users of the round instead, zeros included: FedAvg, the FedRAS-T ablation
(Sec. 5.4.1).

Example (one user, bandwidth 1, d = 2, N = 3):
  rows [[1, 0], [0, 3]] of items 0 and 2 are one action [0.5, 1.5]; the
  result's update is [[0.5, 1.5], [0, 0], [0.5, 1.5]], participants
  [1, 0, 1], uploaded_bytes 4 * 1 * 2 + 2 * 1 = 10.
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec.algorithms.fedras import compression
from tff_fedrec.algorithms.fedras import row_codecs

NORMALIZATIONS = ('participation', 'clients')


def upload_type(dim: int) -> tff.Type:
  """V: the rows a TFF client's group of users uploads (module docstring)."""
  return tff.to_type(
      collections.OrderedDict(
          row_ids=tff.TensorType(np.int32, [None, None]),
          num_rows=tff.TensorType(np.int32, [None]),
          row_values=tff.TensorType(np.float32, [None, None, dim]),
          bandwidth=tff.TensorType(np.int32, [None]),
          seeds=tff.TensorType(np.int64, [None, 2]),
          shared_seed=tff.TensorType(np.int64, [2]),
      )
  )


class ClusteredActionsFactory(tff.aggregators.UnweightedAggregationFactory):
  """Encoded uploads decoded into a mean [N, d]; see the module docstring.

  Args:
    num_items: N, the rows of the item table.
    codec: a `row_codecs` codec; None means `row_codecs.ClusteredActions()`.
    normalization: 'participation' (Sec. 4.4) or 'clients' (FedAvg).
  """

  def __init__(self, num_items: int, *, codec=None,
               normalization: str = 'participation'):
    if num_items < 1:
      raise ValueError(f'num_items must be positive; got {num_items}.')
    if normalization not in NORMALIZATIONS:
      raise ValueError(
          f'normalization must be one of {NORMALIZATIONS}; got '
          f'{normalization!r}.'
      )
    self._num_items = num_items
    self._codec = codec or row_codecs.ClusteredActions()
    self._normalization = normalization

  def create(self, value_type) -> tff.templates.AggregationProcess:
    value_type = tff.to_type(value_type)
    try:
      dim = value_type.row_values.shape[-1]
    except (AttributeError, TypeError, IndexError):
      dim = None
    if dim is None or value_type != upload_type(dim):
      raise TypeError(
          f'Expected a value of type upload_type(d); got {value_type}.'
      )
    num_items, codec = self._num_items, self._codec

    @tff.tensorflow.computation(value_type)
    def encode(value):
      return collections.OrderedDict(
          row_ids=value['row_ids'],
          num_rows=value['num_rows'],
          shared_seed=value['shared_seed'],
          payload=codec.encode(
              value['row_values'], value['num_rows'], value['bandwidth'],
              value['seeds'], value['shared_seed'],
          ),
      )

    message_type = encode.type_signature.result

    @tff.tensorflow.computation(message_type)
    def measure(message):
      num_rows = message['num_rows']
      return collections.OrderedDict(
          uploaded_bytes=tf.reduce_sum(
              codec.message_bytes(message['payload'], num_rows, dim)
          ),
          uploaded_users=tf.size(num_rows),
          compressed_users=tf.reduce_sum(
              tf.cast(codec.compressed(message['payload'], num_rows), tf.int32)
          ),
      )

    @tff.tensorflow.computation
    def zero():
      return collections.OrderedDict(
          update_sum=tf.zeros([num_items, dim], tf.float32),
          participants=tf.zeros([num_items], tf.float32),
          num_users=tf.constant(0.0),
      )

    accumulator_type = zero.type_signature.result

    @tff.tensorflow.computation(accumulator_type, message_type)
    def accumulate(total, message):
      rows = codec.decode(message['payload'], message['shared_seed'], dim)
      update_sum, participants = compression.scatter_rows(
          rows, message['num_rows'], message['row_ids'], num_items
      )
      return collections.OrderedDict(
          update_sum=total['update_sum'] + update_sum,
          participants=total['participants'] + participants,
          num_users=total['num_users']
          + tf.cast(tf.size(message['num_rows']), tf.float32),
      )

    @tff.tensorflow.computation(accumulator_type, accumulator_type)
    def merge(a, b):
      return tf.nest.map_structure(tf.add, a, b)

    normalization = self._normalization

    @tff.tensorflow.computation(accumulator_type)
    def report(total):
      if normalization == 'participation':
        update = compression.normalize_by_participation(
            total['update_sum'], total['participants']
        )
      else:
        update = tf.math.divide_no_nan(total['update_sum'], total['num_users'])
      return collections.OrderedDict(
          update=update, participants=total['participants']
      )

    @tff.federated_computation
    def initialize():
      return tff.federated_value((), tff.SERVER)

    @tff.federated_computation(
        initialize.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
    )
    def next_fn(state, value):
      messages = tff.federated_map(encode, value)
      result = tff.federated_aggregate(
          messages, zero(), accumulate, merge, report
      )
      measurements = tff.federated_sum(tff.federated_map(measure, messages))
      return tff.templates.MeasuredProcessOutput(
          state=state, result=result, measurements=measurements
      )

    return tff.templates.AggregationProcess(initialize, next_fn)
