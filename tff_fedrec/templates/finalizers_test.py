"""The generic finalizers on the toy process (`toy_process`) and on nested
global parameters, against numpy."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec.aggregators import keyed
from tff_fedrec.programs import execution
from tff_fedrec.templates import finalizers
from tff_fedrec.templates import toy_process


@pytest.fixture(scope='module', autouse=True)
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


def _numpy_adam(x, gradients, learning_rate):
  """Adam from zero moments, one step per gradient (Kingma & Ba, Alg. 1)."""
  m = v = np.zeros_like(x, np.float64)
  x = x.astype(np.float64)
  for t, g in enumerate(gradients, start=1):
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    x = x - learning_rate * (m / (1 - 0.9**t)) / (
        np.sqrt(v / (1 - 0.999**t)) + 1e-8)
  return x


def test_server_adam_steps_on_the_aggregate_and_keeps_its_moments():
  process = toy_process.build(
      finalizers.ServerAdam(toy_process.GLOBAL, learning_rate=0.1))
  state = process.initialize()
  for _ in range(3):
    state, _, _ = process.next(state, toy_process.LOCALS, toy_process.DATA)
  # The aggregate, <w=mean>, is the gradient of every round.
  np.testing.assert_allclose(
      state['global_parameters']['w'],
      _numpy_adam(toy_process.GLOBAL['w'], [toy_process.MEAN] * 3, 0.1),
      rtol=1e-5)
  assert state['finalizer']['step'] == 3.0


def _numpy_torch_adagrad(x, gradients, learning_rate, initial=0.0,
                         eps=1e-10):
  """torch.optim.Adagrad's update (lr_decay 0, weight_decay 0): sum +=
  g^2; x -= lr g / (sqrt(sum) + eps)."""
  x = x.astype(np.float64)
  total = np.full_like(x, initial)
  for g in gradients:
    total = total + g * g
    x = x - learning_rate * g / (np.sqrt(total) + eps)
  return x


def test_server_adagrad_is_pytorchs_from_a_zero_accumulator():
  process = toy_process.build(
      finalizers.ServerAdagrad(toy_process.GLOBAL, learning_rate=0.1))
  state = process.initialize()
  state, _, _ = process.next(state, toy_process.LOCALS, toy_process.DATA)
  # From a zero accumulator the first step moves every coordinate whose
  # gradient is not zero by the learning rate itself, whatever |g|
  # (TFF's Adagrad, from 0.1 with eps inside the root, would not).
  np.testing.assert_allclose(
      state['global_parameters']['w'],
      toy_process.GLOBAL['w'] - 0.1 * np.sign(toy_process.MEAN), rtol=1e-6)
  for _ in range(2):
    state, _, _ = process.next(state, toy_process.LOCALS, toy_process.DATA)
  np.testing.assert_allclose(
      state['global_parameters']['w'],
      _numpy_torch_adagrad(toy_process.GLOBAL['w'], [toy_process.MEAN] * 3,
                           0.1), rtol=1e-5)
  np.testing.assert_allclose(state['finalizer']['accumulator']['w'],
                             3 * toy_process.MEAN**2, rtol=1e-5)


def test_subtract_changes_moves_by_minus_the_aggregate():
  process = toy_process.build(finalizers.SubtractChanges())
  state, _, _ = process.next(
      process.initialize(), toy_process.LOCALS, toy_process.DATA)
  np.testing.assert_allclose(state['global_parameters']['w'],
                             toy_process.GLOBAL['w'] - toy_process.MEAN,
                             rtol=1e-6)


def _server_type(structure):
  return tff.FederatedType(tff.to_type(tf.nest.map_structure(
      lambda x: tff.TensorType(np.asarray(x).dtype, np.shape(x)),
      structure)), tff.SERVER)


def test_apply_delta_adds_to_the_parameters_the_aggregate_holds():
  # Nested parameters: a table and a list of two layers; the aggregate
  # holds a delta of the layers only, in their nest.
  params = collections.OrderedDict(
      table=np.arange(6, dtype=np.float32).reshape([3, 2]),
      layers=[collections.OrderedDict(kernel=np.ones([2, 2], np.float32),
                                      bias=np.zeros([2], np.float32)),
              collections.OrderedDict(kernel=np.ones([2, 1], np.float32),
                                      bias=np.ones([1], np.float32))],
  )
  delta = collections.OrderedDict(layers=[
      collections.OrderedDict(kernel=np.full([2, 2], 0.5, np.float32),
                              bias=np.array([1.0, -1.0], np.float32)),
      collections.OrderedDict(kernel=np.array([[2.0], [3.0]], np.float32),
                              bias=np.array([-4.0], np.float32)),
  ])

  @tff.federated_computation(_server_type(params), _server_type(delta))
  def apply(global_parameters, aggregate):
    _, new, _ = finalizers.ApplyDelta().finalize(
        tff.federated_value(collections.OrderedDict(), tff.SERVER),
        global_parameters, aggregate,
        tff.federated_value(np.int32(0), tff.SERVER))
    return new

  got = apply(params, delta)
  np.testing.assert_array_equal(got['table'], params['table'])
  for got_layer, layer, moved in zip(got['layers'], params['layers'],
                                     delta['layers']):
    for key in ('kernel', 'bias'):
      np.testing.assert_array_equal(got_layer[key],
                                    layer[key] + moved[key])


def test_apply_delta_of_nothing_keeps_every_parameter():
  # A method whose clients share nothing (Standalone) aggregates {}.
  process = toy_process.build(
      finalizers.ApplyDelta(),
      upload=lambda received, data: collections.OrderedDict(),
      factory=keyed.KeyedFactory(collections.OrderedDict()))
  state, _, _ = process.next(
      process.initialize(), toy_process.LOCALS, toy_process.DATA)
  np.testing.assert_array_equal(state['global_parameters']['w'],
                                toy_process.GLOBAL['w'])
