"""`KeyedFactory`: each key's entry through its own inner factory."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec.aggregators import keyed
from tff_fedrec.programs import execution


@pytest.fixture(scope='module', autouse=True)
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


class _PlusOneSumFactory(tff.aggregators.UnweightedAggregationFactory):
  """Test double: the sum, + 1 (proves the entry went through it)."""

  def create(self, value_type):
    inner = tff.aggregators.SumFactory().create(value_type)

    @tff.tensorflow.computation(value_type)
    def add_one(value):
      return value + 1.0

    @tff.federated_computation(
        inner.initialize.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS))
    def next_fn(state, value):
      output = inner.next(state, value)
      return tff.templates.MeasuredProcessOutput(
          output.state, tff.federated_map(add_one, output.result),
          tff.federated_value(collections.OrderedDict(seen=np.int32(1)),
                              tff.SERVER))

    return tff.templates.AggregationProcess(inner.initialize, next_fn)


_VALUE_TYPE = collections.OrderedDict(
    mean=tff.TensorType(np.float32, [2]), total=tff.TensorType(np.float32))


def test_weighted_and_unweighted_entries_each_take_their_factory():
  process = keyed.KeyedFactory(collections.OrderedDict(
      mean=tff.aggregators.MeanFactory(), total=_PlusOneSumFactory(),
  )).create(tff.to_type(_VALUE_TYPE), tff.TensorType(np.float32))
  values = [
      collections.OrderedDict(mean=np.array([1.0, 0.0], np.float32),
                              total=np.float32(2.0)),
      collections.OrderedDict(mean=np.array([4.0, 3.0], np.float32),
                              total=np.float32(5.0)),
  ]

  output = process.next(process.initialize(), values, [1.0, 2.0])

  # Weighted mean (1 x [1, 0] + 2 x [4, 3]) / 3; the sum 7, plus one.
  np.testing.assert_allclose(output.result['mean'], [3.0, 2.0])
  assert output.result['total'] == 8.0
  assert list(output.measurements) == ['mean', 'total']
  assert output.measurements['total']['seen'] == 1


def test_the_empty_mapping_aggregates_nothing():
  process = keyed.KeyedFactory(collections.OrderedDict()).create(
      tff.to_type(collections.OrderedDict()), tff.TensorType(np.float32))
  output = process.next(process.initialize(), [collections.OrderedDict()] * 2,
                        [1.0, 1.0])
  assert not output.result and not output.measurements


def test_keys_must_match_the_value():
  factory = keyed.KeyedFactory(collections.OrderedDict(
      mean=tff.aggregators.MeanFactory()))
  with pytest.raises(TypeError, match=r"keys \['mean'\]"):
    factory.create(tff.to_type(_VALUE_TYPE), tff.TensorType(np.float32))
  with pytest.raises(TypeError, match='tff.aggregators factory'):
    keyed.KeyedFactory({'mean': tf.reduce_mean})
