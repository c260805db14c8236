import os
import signal
import socket

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_fedrec.programs import execution


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  with open(f'/proc/{pid}/stat') as f:
    return f.read().split()[2] != 'Z'


@tff.tensorflow.computation(np.float32)
def _add_one(x):
  return x + 1.0


@tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
def _sum_at_server(values):
  return tff.federated_sum(values)


def test_context_runs_computations_and_stops_its_worker():
  previous = tff.framework.get_context_stack().current
  with execution.worker_execution_context() as pid:
    assert _alive(pid)
    assert tff.framework.get_context_stack().current is not previous
    assert _add_one(np.float32(2.0)) == pytest.approx(3.0)
    assert _sum_at_server([1.0, 2.0, 4.0]) == pytest.approx(7.0)
  assert not _alive(pid)
  assert tff.framework.get_context_stack().current is previous


def test_worker_is_stopped_when_the_block_raises():
  with pytest.raises(RuntimeError, match='boom'):
    with execution.worker_execution_context() as pid:
      raise RuntimeError('boom')
  assert not _alive(pid)


def test_an_executor_that_does_not_answer_gives_a_clear_error():
  with socket.socket() as sock:
    sock.bind(('127.0.0.1', 0))
    port = sock.getsockname()[1]
  with pytest.raises(execution.WorkerStartError, match=f'127.0.0.1:{port}'):
    execution.make_remote_context(
        f'127.0.0.1:{port}', ready_timeout_seconds=1.0
    )


def test_a_worker_that_dies_interrupts_the_waiting_computation():
  with pytest.raises(execution.WorkerDiedError, match='SIGKILL'):
    with execution.worker_execution_context() as pid:
      assert _add_one(np.float32(1.0)) == pytest.approx(2.0)
      os.kill(pid, signal.SIGKILL)
      # Without the watchdog TFF would retry the vanished worker forever.
      _add_one(np.float32(1.0))
  assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
