"""`two_phase`: one round as two computations, on one worker and on two."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec.programs import execution
from tff_fedrec.templates import two_phase


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
    # One executor: run_round is `next`, one computation.
    assert not two_phase.context_splits_clients()
    again = two_phase.run_round(_PROCESS, np.float32(1.0), _LOCALS, _DATA)
    # Asked for the uploads, it runs the two steps and shows them in order.
    observed = []
    stepped = two_phase.run_round(
        _PROCESS, np.float32(1.0), _LOCALS, _DATA,
        observe_uploads=observed.extend,
    )
  for result in (again, stepped):
    assert result[0] == pytest.approx(29.0)
    assert result[2] == pytest.approx(28.0)
    np.testing.assert_allclose(result[1], _EXPECTED_LOCALS)
  np.testing.assert_allclose([u['value'] for u in observed], _DATA)


def test_two_workers_give_every_client_its_own_result():
  workers = [execution.start_worker() for _ in range(2)]
  try:
    addresses = [f'127.0.0.1:{port}' for _, port in workers]
    with execution.remote_workers_context(addresses):
      assert two_phase.context_splits_clients()
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
