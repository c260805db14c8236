"""Sum of client updates whose trailing dimension differs, by zero padding.

HeteFedRec (Yuan et al., ICDE 2024, Sec. IV-B) lets each client hold one of
several table sizes N_s < N_m < N_l and upload an update of that width, e.g.
item-embedding updates of shape [I, N_s], [I, N_m] or [I, N_l]. The server
first pads every upload with zeros on its trailing dimension up to the largest
width (Eq. 7),

  grad_p V_i = padding(grad V_i | N_l),

then sums the padded uploads over all clients of the round and hands each
width its leading slice (Eq. 8):

  grad V_agg = sum_i grad_p V_i,    grad V_w = grad V_agg[..., :N_w].

So the small, medium and large tables all receive, in the prefix dimensions
they share, the sum over every client of that prefix: column j < N_s gets
the updates of all clients, column N_s <= j < N_m only those of medium and
large clients, and so on. The factory works on plain tensors and a list of
widths and knows nothing about the model the tensors come from.
"""

import collections
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


class PaddedSumFactory(tff.aggregators.UnweightedAggregationFactory):
  """Padding-aware sum of HeteFedRec (Eq. 7-8) over uploads of several widths.

  `create(value_type)` takes float32[d_1, ..., d_k, None]: every dimension
  known but the trailing one, whose size each client chooses, at most
  max(output_widths). The process's result is a tuple with one
  float32[d_1, ..., d_k, w] per w of `output_widths`, in that order: the
  first w columns of the sum over clients of their uploads zero-padded to
  max(output_widths). Its state is `()` and its measurements are
  `OrderedDict(clients_per_width=int32[len(output_widths)])`, how many
  clients uploaded exactly each width.

  Example:
    >>> process = PaddedSumFactory([1, 2]).create(
    ...     tff.TensorType(np.float32, [2, None]))
    >>> output = process.next(process.initialize(), [
    ...     np.array([[1.0], [2.0]], np.float32),
    ...     np.array([[10.0, 20.0], [30.0, 40.0]], np.float32)])
    >>> output.result
    (array([[11.], [32.]], dtype=float32),
     array([[11., 20.], [32., 40.]], dtype=float32))
    >>> output.measurements['clients_per_width']
    array([1, 1], dtype=int32)
  """

  def __init__(self, output_widths: Sequence[int]):
    widths = tuple(output_widths)
    if not widths:
      raise ValueError('output_widths must name at least one width.')
    if not all(isinstance(w, (int, np.integer)) and w > 0 for w in widths):
      raise ValueError(
          f'output_widths must be positive integers; got {widths}.'
      )
    if any(a >= b for a, b in zip(widths, widths[1:])):
      raise ValueError(
          f'output_widths must be strictly increasing; got {widths}.'
      )
    self._output_widths = tuple(int(w) for w in widths)

  def create(self, value_type) -> tff.templates.AggregationProcess:
    value_type = tff.to_type(value_type)
    if (
        not isinstance(value_type, tff.TensorType)
        or value_type.dtype != np.float32
        or value_type.shape is None
        or not value_type.shape
        or value_type.shape[-1] is not None
        or None in value_type.shape[:-1]
    ):
      raise TypeError(
          'Expected a float32 tensor whose trailing dimension is None and '
          'whose other dimensions are known, e.g. '
          f'tff.TensorType(np.float32, [num_items, None]); got {value_type}.'
      )
    widths = self._output_widths
    max_width = widths[-1]
    leading_shape = list(value_type.shape[:-1])
    sum_type = collections.OrderedDict(
        padded=tff.TensorType(np.float32, leading_shape + [max_width]),
        clients_per_width=tff.TensorType(np.int32, [len(widths)]),
    )

    @tff.tensorflow.computation(value_type)
    def pad(value):
      width = tf.shape(value)[-1]
      # tf.pad's own error for a negative pad would not say which limit the
      # client broke.
      too_wide = tf.debugging.assert_less_equal(
          width,
          max_width,
          message=f'An upload is wider than max(output_widths) = {max_width}',
      )
      with tf.control_dependencies([too_wide]):
        paddings = [[0, 0]] * len(leading_shape) + [[0, max_width - width]]
        padded = tf.pad(value, paddings)
      # Keeps the static shape that tf.pad loses with a dynamic padding, so
      # the padded uploads of all clients share one type and can be summed.
      padded = tf.ensure_shape(padded, leading_shape + [max_width])
      return collections.OrderedDict(
          padded=padded,
          clients_per_width=tf.cast(tf.equal(widths, width), tf.int32),
      )

    @tff.tensorflow.computation(sum_type['padded'])
    def slice_per_width(padded_sum):
      return tuple(padded_sum[..., :w] for w in widths)

    @tff.federated_computation
    def initialize():
      return tff.federated_value((), tff.SERVER)

    @tff.federated_computation(
        initialize.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
    )
    def next_fn(state, value):
      total = tff.federated_sum(tff.federated_map(pad, value))
      return tff.templates.MeasuredProcessOutput(
          state=state,
          result=tff.federated_map(slice_per_width, total.padded),
          measurements=tff.federated_zip(
              collections.OrderedDict(
                  clients_per_width=total.clients_per_width
              )
          ),
      )

    return tff.templates.AggregationProcess(initialize, next_fn)
