"""The composer on toy roles (`toy_process`), against numpy: a round, and
the roles it refuses before building anything."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec.aggregators import keyed
from tff_fedrec.programs import execution
from tff_fedrec.templates import composer
from tff_fedrec.templates import distributors
from tff_fedrec.templates import finalizers
from tff_fedrec.templates import roles
from tff_fedrec.templates import toy_process
from tff_fedrec.templates import two_phase


@pytest.fixture(scope='module', autouse=True)
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


def _names(struct_type):
  return [name for name, _ in tff.structure.iter_elements(struct_type)]


def test_a_round_is_distribute_work_aggregate_finalize():
  process = toy_process.build(finalizers.ApplyDelta())
  assert isinstance(process, two_phase.TwoPhaseProcess)
  state = process.initialize()
  assert _names(process.initialize.type_signature.result.member) == [
      'global_parameters', 'distributor', 'aggregator', 'finalizer',
      'round_num',
  ]

  state, new_locals, metrics = process.next(
      state, toy_process.LOCALS, toy_process.DATA)

  np.testing.assert_allclose(state['global_parameters']['w'],
                             toy_process.GLOBAL['w'] + toy_process.MEAN,
                             rtol=1e-6)
  assert state['round_num'] == 1
  # Round 0, first global entry 1.0: every user's state moves by 1.
  np.testing.assert_allclose(new_locals[0], [1.0, 11.0])
  np.testing.assert_allclose(new_locals[1], [6.0])
  # The loss over all examples, and the clients' metrics summed.
  assert metrics['train_loss'] == pytest.approx(5.0 / 3.0)
  assert metrics['num_examples'] == 3.0
  assert metrics['client_work']['loss_sum'] == pytest.approx(5.0)
  assert list(metrics) == ['train_loss', 'num_examples', 'client_work',
                           'aggregator', 'finalizer', 'distributor']

  # Round 1 starts from round 0's global parameters (first entry 1 + 8/3).
  _, again, _ = process.next(state, toy_process.LOCALS, toy_process.DATA)
  np.testing.assert_allclose(again[1], [5.0 + 1.0 + 1.0 + 8.0 / 3.0],
                             rtol=1e-6)


def _compose(**changes):
  """The toy process's roles, some of them replaced."""
  initial = toy_process.initial(toy_process.GLOBAL)
  distributor = distributors.Broadcast()
  work = toy_process.client_work(
      distributor.received_type(initial.type_signature.result))
  arguments = dict(
      initial_global_parameters=initial,
      distributor=distributor,
      client_work=work,
      aggregator=keyed.KeyedFactory(collections.OrderedDict(
          w=tff.aggregators.MeanFactory())).create(
              work.upload_type.update, tff.TensorType(np.float32)),
      finalizer=finalizers.ApplyDelta(),
  )
  arguments.update(changes)
  return composer.compose_client_state_process(**arguments)


class _NoRecord:
  """A distributor without `record`."""

  initial_state = distributors.Broadcast.initial_state

  def received_type(self, global_type):
    return distributors.Broadcast().received_type(global_type)

  def distribute(self, server_state):
    return distributors.Broadcast().distribute(server_state)


def test_every_role_is_checked_for_its_members():
  assert isinstance(distributors.Broadcast(), roles.Distributor)
  assert isinstance(finalizers.ServerAdam(toy_process.GLOBAL,
                                          learning_rate=0.1),
                    roles.Finalizer)
  with pytest.raises(TypeError, match='distributor must play the '
                     'Distributor role'):
    _compose(distributor=_NoRecord())
  with pytest.raises(TypeError, match='finalizer must play the Finalizer'):
    _compose(finalizer=object())
  with pytest.raises(TypeError, match='client_work must play'):
    _compose(client_work=lambda x: x)


def test_a_client_work_that_cannot_take_the_broadcast_is_refused():
  # Built for a global model of three entries, composed with one of two.
  wide = toy_process.initial(collections.OrderedDict(
      w=np.zeros([3], np.float32)))
  work = toy_process.client_work(
      distributors.Broadcast().received_type(wide.type_signature.result))
  with pytest.raises(TypeError, match='cannot take what the distributor '
                     'sends'):
    _compose(client_work=work)


def test_an_aggregation_of_another_value_is_refused():
  other = keyed.KeyedFactory(collections.OrderedDict(
      w=tff.aggregators.MeanFactory())).create(
          tff.to_type(collections.OrderedDict(
              w=tff.TensorType(np.float32, [5]))),
          tff.TensorType(np.float32))
  with pytest.raises(TypeError, match="cannot take the uploads' update"):
    _compose(aggregator=other)
  unweighted = tff.aggregators.UnweightedMeanFactory().create(
      tff.to_type(collections.OrderedDict(
          w=tff.TensorType(np.float32, [2]))))
  with pytest.raises(TypeError, match='must be weighted'):
    _compose(aggregator=unweighted)


def test_an_upload_without_its_metrics_is_refused():

  @tff.tensorflow.computation(
      distributors.Broadcast().received_type(
          toy_process.initial(toy_process.GLOBAL).type_signature.result),
      tff.TensorType(np.float32, [None]), toy_process.DATA_TYPE,
  )
  def client_update(received, local, data):
    del received
    return local, collections.OrderedDict(
        update=collections.OrderedDict(w=data['upload'][0]),
        weight=tf.constant(1.0),
        metrics=collections.OrderedDict(loss=tf.reduce_sum(data['loss'])))

  with pytest.raises(TypeError, match='loss_sum, num_examples'):
    _compose(client_work=roles.client_work(client_update))
