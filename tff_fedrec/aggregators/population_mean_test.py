"""`PopulationMeanFactory`: the inner mean scaled by the round's share."""

import collections

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_fedrec.aggregators import population_mean
from tff_fedrec.aggregators import sparse_rows
from tff_fedrec.programs import execution


@pytest.fixture(scope='module', autouse=True)
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


class _DoubleMeanFactory(tff.aggregators.WeightedAggregationFactory):
  """Test double: twice the weighted mean (proves the inner factory's
  result is the one scaled), with a measurement of its own."""

  def create(self, value_type, weight_type):
    inner = tff.aggregators.MeanFactory().create(value_type, weight_type)

    @tff.tensorflow.computation(value_type)
    def double(value):
      return 2.0 * value

    @tff.federated_computation(
        inner.initialize.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      output = inner.next(state, value, weight)
      return tff.templates.MeasuredProcessOutput(
          output.state, tff.federated_map(double, output.result),
          tff.federated_value(collections.OrderedDict(seen=np.int32(7)),
                              tff.SERVER))

    return tff.templates.AggregationProcess(inner.initialize, next_fn)


def _create(inner, population, value_type):
  return population_mean.PopulationMeanFactory(
      inner, population=population).create(value_type,
                                           tff.TensorType(np.float32))


def test_sum_of_weighted_values_over_the_population():
  process = _create(tff.aggregators.MeanFactory(), 10,
                    tff.TensorType(np.float32, [2]))
  values = [np.array([1.0, 2.0], np.float32), np.array([4.0, -1.0], np.float32)]
  weights = [3.0, 1.0]
  output = process.next(process.initialize(), values, weights)
  # (3 x [1, 2] + 1 x [4, -1]) / 10: the 6 users outside the round add 0.
  np.testing.assert_allclose(output.result, [0.7, 0.5], rtol=1e-6)


def test_a_round_of_the_whole_population_is_the_inner_mean():
  process = _create(tff.aggregators.MeanFactory(), 4,
                    tff.TensorType(np.float32, [2]))
  values = [np.array([1.0, 2.0], np.float32), np.array([4.0, -1.0], np.float32)]
  output = process.next(process.initialize(), values, [3.0, 1.0])
  np.testing.assert_allclose(output.result, [7.0 / 4, 5.0 / 4], rtol=1e-6)


def test_scales_the_inner_factorys_result_and_keeps_its_measurements():
  process = _create(_DoubleMeanFactory(), 8, tff.TensorType(np.float32))
  output = process.next(process.initialize(), [1.0, 3.0], [1.0, 1.0])
  # Twice the mean (2 x 2) times the share 2 / 8.
  assert output.result == pytest.approx(1.0)
  assert output.measurements['seen'] == 7


def test_nests_a_row_sparse_mean_and_a_structured_mean():
  table = _create(sparse_rows.RowSparseMeanFactory(3), 5,
                  sparse_rows.row_sparse_type(1))
  uploads = [
      collections.OrderedDict(row_ids=np.array([0], np.int32),
                              row_values=np.array([[2.0]], np.float32)),
      collections.OrderedDict(row_ids=np.array([0, 2], np.int32),
                              row_values=np.array([[4.0], [6.0]], np.float32)),
  ]
  output = table.next(table.initialize(), uploads, [1.0, 1.0])
  # Row 0: (2 + 4) / 5; row 2: 6 / 5; the rows' count is still measured.
  np.testing.assert_allclose(output.result, [[1.2], [0.0], [1.2]], rtol=1e-6)
  assert output.measurements['uploaded_rows'] == 3

  layers_type = tff.to_type([collections.OrderedDict(
      kernel=tff.TensorType(np.float32, [2, 1]),
      bias=tff.TensorType(np.float32, [1]))])
  dense = _create(tff.aggregators.MeanFactory(), 4, layers_type)
  values = [
      [collections.OrderedDict(kernel=np.ones([2, 1], np.float32),
                               bias=np.array([2.0], np.float32))],
      [collections.OrderedDict(kernel=np.full([2, 1], 3.0, np.float32),
                               bias=np.array([-2.0], np.float32))],
  ]
  output = dense.next(dense.initialize(), values, [1.0, 1.0])
  np.testing.assert_allclose(output.result[0]['kernel'], [[1.0], [1.0]])
  np.testing.assert_allclose(output.result[0]['bias'], [0.0], atol=1e-7)


def test_refuses_an_unweighted_inner_factory_and_an_empty_population():
  with pytest.raises(TypeError, match='weighted'):
    population_mean.PopulationMeanFactory(tff.aggregators.SumFactory(),
                                          population=3)
  with pytest.raises(ValueError, match='population'):
    population_mean.PopulationMeanFactory(tff.aggregators.MeanFactory(),
                                          population=0)
