"""The sample-weighted mean of per-user updates, each encoded by its user's
tier, with a per-element denominator: RF²'s aggregation (Maeng et al.,
RecSys '22, Sec. 5.2; `../shared/specs/rf2.md` section 2).

A TFF client's value holds the updates of its group of users, stacked:

  value = <delta = a nest of float32 [U, ...], tier = int32 [U],
           seed = int64 [U, 2]>,   weight = float32 [U] (n_u, samples)

At the clients every user's delta is encoded tensor by tensor by its tier's
codec (`tier_codecs.UpdateCodec`: Prune, Quant, QuantS, or none; a
tensor's seed is the user's folded with the tensor's index in `tf.nest`'s
flattened, name-sorted order), so what is
summed is what the server would decode, and each message's bytes are
counted per tier. With `masks` (Channel, HeteroFL: a nest of 0/1 arrays per
tier, broadcastable to each parameter; codecs then untouched) an element
counts only for the users whose tier uses it, and a message holds the
elements its tier's masks keep (4 bytes each):

  result = sum_u n_u m_t(u) decode(encode(delta_u)) / sum_u n_u m_t(u)

elementwise, 0 where no user's tier uses an element (HeteroFL's
per-element mean; without masks m = 1 and it is FedAvg's sample-weighted
mean, a pruned element then still counting in the denominator, as the
code does). The server gets the weighted sums of all clients
(`federated_sum`) and divides once. Measurements: `bytes_per_tier` and
`users_per_tier`, float32 [T], summed over the round.

Example:
  >>> factory = TierCodecMeanFactory(
  ...     [UpdateCodec('quants', 8), UpdateCodec('quants', 16),
  ...      UpdateCodec()])
  >>> process = factory.create(value_type, tff.TensorType(np.float32, [None]))
"""

import collections
from collections.abc import Sequence
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import tier_codecs


def _stack_masks(masks, delta_structure):
  """One constant per parameter: the tiers' masks stacked [T, ...]."""
  stacked = [np.stack([np.asarray(leaf, np.float32) for leaf in leaves])
             for leaves in zip(*[tf.nest.flatten(m) for m in masks])]
  if len(stacked) != len(tf.nest.flatten(delta_structure)):
    raise TypeError('Each tier\'s masks must hold one array per parameter.')
  return stacked


class TierCodecMeanFactory(tff.aggregators.WeightedAggregationFactory):
  """The aggregation of the module docstring.

  Args:
    codecs: One `tier_codecs.UpdateCodec` per tier.
    masks: None, or per tier a nest of 0/1 arrays in the nest of the
      delta, each broadcastable to its parameter without the user axis.
  """

  def __init__(self, codecs: Sequence[tier_codecs.UpdateCodec],
               masks: Optional[Sequence] = None):
    self._codecs = tuple(codecs)
    if not self._codecs:
      raise ValueError('Give at least one tier\'s codec.')
    if masks is not None and len(masks) != len(self._codecs):
      raise ValueError(f'{len(masks)} tiers of masks for '
                       f'{len(self._codecs)} tiers of codecs.')
    if masks is not None and not all(c.untouched for c in self._codecs):
      raise ValueError('Masks (Channel) and codecs are RF²\'s separate '
                       'optimisations: give one or the other.')
    self._masks = masks

  def create(self, value_type, weight_type=tff.TensorType(np.float32, [None])
             ) -> tff.templates.AggregationProcess:
    value_type = tff.to_type(value_type)
    names = [name for name, _ in tff.structure.iter_elements(value_type)]
    if names != ['delta', 'tier', 'seed']:
      raise TypeError('The value must be <delta, tier, seed>; got '
                      f'{value_type}.')
    delta_type = value_type.delta
    codecs, tiers = self._codecs, len(self._codecs)
    delta_structure = tff.types.type_to_py_container(
        tff.structure.map_structure(lambda _: 0, delta_type), delta_type)
    masks = (None if self._masks is None
             else _stack_masks(self._masks, delta_structure))

    @tff.tensorflow.computation(value_type, weight_type)
    def client_sums(value, weight):
      deltas = tf.nest.flatten(value['delta'])
      decoded, sizes = tier_codecs.encode_users(
          codecs, deltas, value['tier'], value['seed'])
      if masks is not None:
        # A Channel tier sends the elements its sub-model holds.
        sizes = tf.add_n([
            4.0 * tf.reduce_sum(tf.broadcast_to(
                tf.gather(mask, value['tier']),
                tf.concat([tf.shape(value['tier']), d.shape[1:]], 0)),
                axis=tf.range(1, len(d.shape)))
            for mask, d in zip(masks, deltas)])
      numerators, denominators = [], []
      for index, user_decoded in enumerate(decoded):
        rank = len(user_decoded.shape) - 1
        user_weight = tf.reshape(weight, [-1] + [1] * rank)
        if masks is not None:
          user_weight = user_weight * tf.gather(masks[index], value['tier'])
        numerators.append(tf.reduce_sum(user_weight * user_decoded, axis=0))
        denominators.append(tf.reduce_sum(
            user_weight + tf.zeros_like(user_decoded), axis=0))
      return collections.OrderedDict(
          numerator=numerators, denominator=denominators,
          bytes_per_tier=tf.math.unsorted_segment_sum(
              sizes, value['tier'], tiers),
          users_per_tier=tf.math.unsorted_segment_sum(
              tf.ones_like(sizes), value['tier'], tiers))

    sums_type = client_sums.type_signature.result

    @tff.tensorflow.computation(sums_type)
    def mean(sums):
      means = [tf.math.divide_no_nan(n, d)
               for n, d in zip(sums['numerator'], sums['denominator'])]
      return tf.nest.pack_sequence_as(delta_structure, means)

    @tff.federated_computation
    def initialize():
      return tff.federated_value((), tff.SERVER)

    @tff.federated_computation(
        initialize.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      sums = tff.federated_sum(tff.federated_map(client_sums, (value, weight)))
      return tff.templates.MeasuredProcessOutput(
          state=state, result=tff.federated_map(mean, sums),
          measurements=tff.federated_zip(collections.OrderedDict(
              bytes_per_tier=sums.bytes_per_tier,
              users_per_tier=sums.users_per_tier)))

    return tff.templates.AggregationProcess(initialize, next_fn)
