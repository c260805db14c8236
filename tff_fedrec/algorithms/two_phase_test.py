"""`two_phase`: one round as two computations, on one worker and on two."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec.algorithms import two_phase
from tff_fedrec.programs import execution


@tff.tensorflow.computation(np.float32, np.float32, np.float32)
def _client_update(server_value, local, data):
  # The new local state depends on the client's own data, so a result handed
  # to the wrong client shows.
  return local + data, collections.OrderedDict(value=server_value * data)


@tff.tensorflow.computation
def _initial_state():
  return tf.constant(1.0)


@tff.tensorflow.computation(np.float32, np.float32)
def _add(state, total):
  return state + total


@tff.federated_computation
def _initialize():
  return tff.federated_eval(_initial_state, tff.SERVER)


@tff.federated_computation(
    tff.FederatedType(np.float32, tff.SERVER),
    tff.FederatedType(np.float32, tff.CLIENTS),
    tff.FederatedType(np.float32, tff.CLIENTS),
)
def _client_step(state, locals_, data):
  return tff.federated_map(
      _client_update, (tff.federated_broadcast(state), locals_, data)
  )


@tff.federated_computation(
    tff.FederatedType(np.float32, tff.SERVER),
    tff.FederatedType(
        collections.OrderedDict(value=np.float32), tff.CLIENTS
    ),
)
def _server_step(state, uploads):
  total = tff.federated_sum(uploads.value)
  return tff.federated_map(_add, (state, total)), total


_PROCESS = two_phase.TwoPhaseProcess(_initialize, _client_step, _server_step)
_LOCALS = [np.float32(10 * i) for i in range(7)]
_DATA = [np.float32(i + 1) for i in range(7)]
# next: locals 10 i + (i + 1); state 1 + 1 * (1 + ... + 7) = 29; metrics 28.
_EXPECTED_LOCALS = [10 * i + i + 1 for i in range(7)]


def test_next_is_the_client_step_then_the_server_step():
  with execution.worker_execution_context():
    state = _PROCESS.initialize()
    state, new_locals, metrics = _PROCESS.next(state, _LOCALS, _DATA)
    assert state == pytest.approx(29.0)
    assert metrics == pytest.approx(28.0)
    np.testing.assert_allclose(new_locals, _EXPECTED_LOCALS)
    again = two_phase.run_round(_PROCESS, np.float32(1.0), _LOCALS, _DATA)
  assert again[0] == pytest.approx(29.0)
  np.testing.assert_allclose(again[1], _EXPECTED_LOCALS)


def test_two_workers_give_every_client_its_own_result():
  workers = [execution.start_worker() for _ in range(2)]
  try:
    addresses = [f'127.0.0.1:{port}' for _, port in workers]
    with execution.remote_workers_context(addresses):
      for _ in range(3):
        state, new_locals, metrics = two_phase.run_round(
            _PROCESS, np.float32(1.0), _LOCALS, _DATA
        )
        assert state == pytest.approx(29.0)
        assert metrics == pytest.approx(28.0)
        np.testing.assert_allclose(new_locals, _EXPECTED_LOCALS)
  finally:
    for process, _ in workers:
      execution.stop_worker(process)


@tff.tensorflow.computation(
    np.float32, np.float32,
    collections.OrderedDict(x=np.float32, users=np.float32),
)
def _upload_update(server_value, local, data):
  """Item upload x, dense delta <w = 2x>, loss x over 2 examples."""
  del server_value
  return (
      data['x'],
      collections.OrderedDict(w=2.0 * data['x']),
      local + data['x'],
      collections.OrderedDict(
          loss_sum=data['x'], num_examples=tf.constant(2.0),
          num_users=data['users'],
      ),
  )


def _building_block_steps(item_factory, dense_factory, weigh_items):
  item_aggregation = (
      item_factory.create(tff.TensorType(np.float32), tff.TensorType(np.float32))
      if weigh_items else item_factory.create(tff.TensorType(np.float32))
  )
  dense_aggregation = None if dense_factory is None else dense_factory.create(
      tff.to_type(collections.OrderedDict(w=np.float32)),
      tff.TensorType(np.float32),
  )

  @tff.federated_computation
  def initialize():
    return tff.federated_zip(collections.OrderedDict(
        aggregator=two_phase.initial_aggregator_state(
            item_aggregation, dense_aggregation
        ),
        round_num=tff.federated_value(np.int32(4), tff.SERVER),
    ))

  state_type = initialize.type_signature.result

  @tff.federated_computation(
      state_type,
      tff.FederatedType(np.float32, tff.CLIENTS),
      tff.FederatedType(_upload_update.type_signature.parameter[2],
                        tff.CLIENTS),
  )
  def client_step(state, locals_, data):
    return two_phase.run_client_update(
        _upload_update,
        (tff.federated_value(np.float32(0), tff.CLIENTS), locals_, data),
    )

  @tff.federated_computation(state_type, two_phase.uploads_type(_upload_update))
  def server_step(state, uploads):
    aggregated = two_phase.aggregate_uploads(
        item_aggregation, dense_aggregation, state.aggregator, uploads,
        weigh_items=weigh_items,
    )
    train_loss, num_examples = two_phase.mean_train_loss(uploads.metrics)
    new_state = tff.federated_zip(collections.OrderedDict(
        aggregator=aggregated.state,
        round_num=two_phase.next_round_num(state.round_num),
    ))
    return new_state, tff.federated_zip(collections.OrderedDict(
        item=aggregated.item, dense=aggregated.dense_mean,
        train_loss=train_loss, num_examples=num_examples,
    ))

  return two_phase.TwoPhaseProcess(initialize, client_step, server_step)


def test_the_building_blocks_aggregate_items_dense_deltas_and_loss():
  data = [collections.OrderedDict(x=np.float32(x), users=np.float32(u))
          for x, u in ((1.0, 1.0), (4.0, 3.0))]
  with execution.worker_execution_context():
    # Items weighted by users: (1 x 1 + 4 x 3) / 4; dense mean the same x 2.
    process = _building_block_steps(
        tff.aggregators.MeanFactory(), tff.aggregators.MeanFactory(), True
    )
    state, new_locals, metrics = process.next(
        process.initialize(), [np.float32(0), np.float32(10)], data
    )
    assert metrics['item'] == pytest.approx(13 / 4)
    assert metrics['dense']['w'] == pytest.approx(2 * 13 / 4)
    # Loss (1 + 4) over 2 + 2 examples.
    assert metrics['train_loss'] == pytest.approx(5 / 4)
    assert metrics['num_examples'] == pytest.approx(4.0)
    assert state['round_num'] == 5
    np.testing.assert_allclose(new_locals, [1.0, 14.0])
    assert set(state['aggregator']) == {'item', 'dense'}

    # Unweighted items (a sum), no dense parameters: an empty dense mean.
    process = _building_block_steps(tff.aggregators.SumFactory(), None, False)
    state, _, metrics = process.next(
        process.initialize(), [np.float32(0), np.float32(10)], data
    )
    assert metrics['item'] == pytest.approx(5.0)
    assert not metrics['dense'] and list(state['aggregator']) == ['item']
