"""Weighted mean of row-sparse client updates into a dense table.

A client that touched T rows of an [N, d] table uploads `OrderedDict(
row_ids=int32[T], row_values=float32[T, d])`: the rows' ids and their values,
with a weight w_i. The server result is the dense [N, d] weighted mean

  mean[r] = sum_i w_i sum_{t: row_ids_i[t] = r} row_values_i[t] / sum_i w_i,

which equals the weighted mean of the clients' dense updates (zero outside the
rows they touched) without any client sending or the server summing untouched
rows. Duplicate ids within one upload add up. With w_i = 1 this is PFedRec's
Algorithm 1 line 6, theta^m <- 1/n sum_i theta_i^m; a TFF client that
simulates U users uploads their mean with w_i = U, which gives the same mean
over users.
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


def row_sparse_type(row_dim: int) -> tff.Type:
  """The type of one client's row-sparse upload."""
  return tff.to_type(
      collections.OrderedDict(
          row_ids=tff.TensorType(np.int32, [None]),
          row_values=tff.TensorType(np.float32, [None, row_dim]),
      )
  )


class RowSparseMeanFactory(tff.aggregators.WeightedAggregationFactory):
  """Weighted mean of row-sparse updates of an [num_rows, d] table.

  `create(value_type, weight_type)` takes `row_sparse_type(d)` and float32;
  the process's result is float32[num_rows, d] and its measurements count the
  uploaded rows.

  Example:
    >>> process = RowSparseMeanFactory(num_rows=3).create(
    ...     row_sparse_type(1), tff.TensorType(np.float32))
    >>> state = process.initialize()
    >>> process.next(state, [
    ...     {'row_ids': [0], 'row_values': [[2.0]]},
    ...     {'row_ids': [0, 2], 'row_values': [[4.0], [6.0]]}], [1.0, 1.0]).result
    array([[3.], [0.], [3.]], dtype=float32)
  """

  def __init__(self, num_rows: int):
    if num_rows < 1:
      raise ValueError(f'num_rows must be positive; got {num_rows}.')
    self._num_rows = num_rows

  def create(
      self, value_type, weight_type=tff.TensorType(np.float32)
  ) -> tff.templates.AggregationProcess:
    value_type = tff.to_type(value_type)
    row_dim = value_type.row_values.shape[1]
    if value_type != row_sparse_type(row_dim):
      raise TypeError(
          f'Expected a value of type {row_sparse_type(row_dim)}; got '
          f'{value_type}.'
      )
    weight_type = tff.to_type(weight_type)
    if weight_type != tff.TensorType(np.float32):
      raise TypeError(f'Expected a float32 weight; got {weight_type}.')
    table_type = tff.TensorType(np.float32, [self._num_rows, row_dim])
    num_rows = self._num_rows

    @tff.tensorflow.computation(value_type, weight_type)
    def weigh(update, weight):
      return collections.OrderedDict(
          row_ids=update['row_ids'], row_values=update['row_values'] * weight
      )

    @tff.tensorflow.computation
    def zero():
      return tf.zeros([num_rows, row_dim], tf.float32)

    @tff.tensorflow.computation(table_type, value_type)
    def accumulate(table, update):
      return tf.tensor_scatter_nd_add(
          table, tf.expand_dims(update['row_ids'], 1), update['row_values']
      )

    @tff.tensorflow.computation(table_type, table_type)
    def merge(a, b):
      return a + b

    @tff.tensorflow.computation(table_type)
    def report(table):
      return table

    @tff.tensorflow.computation(value_type)
    def count_rows(update):
      return tf.cast(tf.shape(update['row_ids'])[0], tf.float32)

    @tff.tensorflow.computation(table_type, np.float32)
    def divide(table, total_weight):
      return tf.math.divide_no_nan(table, total_weight)

    @tff.federated_computation
    def initialize():
      return tff.federated_value((), tff.SERVER)

    @tff.federated_computation(
        initialize.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS),
    )
    def next_fn(state, value, weight):
      weighted = tff.federated_map(weigh, (value, weight))
      total = tff.federated_aggregate(
          weighted, zero(), accumulate, merge, report
      )
      total_weight = tff.federated_sum(weight)
      uploaded_rows = tff.federated_sum(tff.federated_map(count_rows, value))
      return tff.templates.MeasuredProcessOutput(
          state=state,
          result=tff.federated_map(divide, (total, total_weight)),
          measurements=tff.federated_zip(
              collections.OrderedDict(uploaded_rows=uploaded_rows)
          ),
      )

    return tff.templates.AggregationProcess(initialize, next_fn)
