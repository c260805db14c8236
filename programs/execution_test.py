from concurrent import futures
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types

import grpc
import numpy as np
import pytest
import tensorflow_federated as tff

from tff_fedrec.programs import execution
from tff_fedrec.programs import loopback_bind


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


def test_an_address_nobody_listens_at_fails_before_the_timeout(monkeypatch):
  # Refused connections end the wait after _REFUSED_SECONDS, not after the
  # (here one-minute) timeout for a worker that is slow to answer.
  monkeypatch.setattr(execution, '_REFUSED_SECONDS', 0.2)
  with socket.socket() as sock:
    sock.bind(('127.0.0.1', 0))
    port = sock.getsockname()[1]
  with pytest.raises(execution.WorkerStartError,
                     match=f'Nothing listens at 127.0.0.1:{port}'):
    execution.make_remote_context(
        f'127.0.0.1:{port}', ready_timeout_seconds=60.0
    )


def test_a_worker_that_dies_interrupts_the_waiting_computation():
  with pytest.raises(execution.WorkerDiedError, match='SIGKILL'):
    with execution.worker_execution_context() as pid:
      assert _add_one(np.float32(1.0)) == pytest.approx(2.0)
      os.kill(pid, signal.SIGKILL)
      # Without the watchdog TFF would retry the vanished worker forever.
      _add_one(np.float32(1.0))
  assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


class _DisposalError(grpc.RpcError):
  """Stands for the RetryableGRPCError of a dispose on a dead worker."""


def _unraisable(error):
  return types.SimpleNamespace(
      exc_type=type(error), exc_value=error, exc_traceback=None,
      err_msg=None, object=None,
  )


def _assert_drops_disposal_errors_only(hook, passed_on):
  """`hook` drops a disposal's gRPC error and passes a real bug on (to
  the hook that appends to `passed_on`)."""
  hook(_unraisable(_DisposalError()))
  other = _unraisable(ValueError('a real bug'))
  hook(other)
  assert passed_on == [other]


def test_disposal_errors_hook_drops_grpc_errors_only():
  passed_on = []
  _assert_drops_disposal_errors_only(
      execution.quiet_disposal_errors_hook(passed_on.append), passed_on)


def test_a_dead_worker_quiets_the_disposal_errors_that_follow():
  previous = sys.unraisablehook
  passed_on = []
  sys.unraisablehook = passed_on.append
  try:
    with pytest.raises(execution.WorkerDiedError, match='SIGKILL'):
      with execution.worker_execution_context() as pid:
        os.kill(pid, signal.SIGKILL)
        _add_one(np.float32(1.0))
    installed = sys.unraisablehook
  finally:
    sys.unraisablehook = previous
  _assert_drops_disposal_errors_only(installed, passed_on)


def test_disposal_errors_are_quiet_inside_the_block_and_restored_after_it():
  # A remote worker counts as gone only after unreachable_seconds; disposals
  # fail before that (CI printed such a traceback), so the hook cannot wait
  # for the watchdog.
  previous = sys.unraisablehook
  passed_on = []
  sys.unraisablehook = passed_on.append
  try:
    with execution.worker_execution_context():
      inside = sys.unraisablehook
      assert _add_one(np.float32(1.0)) == 2.0
    after = sys.unraisablehook
  finally:
    sys.unraisablehook = previous
  _assert_drops_disposal_errors_only(inside, passed_on)
  assert after == passed_on.append


def test_a_grpc_server_without_the_executor_service_is_not_a_tff_worker():
  server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
  port = server.add_insecure_port('127.0.0.1:0')
  server.start()
  try:
    with pytest.raises(
        execution.WorkerStartError,
        match=(f'127.0.0.1:{port} answers gRPC, but it is not a TFF worker: '
               'it has no TFF executor service'),
    ):
      execution.make_workers_context(
          [f'127.0.0.1:{port}'], ready_timeout_seconds=60.0
      )
  finally:
    server.stop(None)


def test_an_address_that_closes_every_connection_fails_before_the_timeout(
    monkeypatch
):
  # As an SSH tunnel does with nothing at its far end: the connection is
  # accepted, so only the unanswered HTTP/2 preface tells.
  monkeypatch.setattr(execution, '_REFUSED_SECONDS', 0.2)
  listener = socket.create_server(('127.0.0.1', 0))
  port = listener.getsockname()[1]

  def close_every_connection():
    with contextlib.suppress(OSError):  # The listener closed: the test ended.
      while True:
        connection, _ = listener.accept()
        connection.close()

  threading.Thread(target=close_every_connection, daemon=True).start()
  try:
    with pytest.raises(execution.WorkerStartError,
                       match=f'No TFF worker answers at 127.0.0.1:{port}'):
      execution.make_workers_context(
          [f'127.0.0.1:{port}'], ready_timeout_seconds=60.0
      )
  finally:
    listener.close()


def test_a_local_worker_listens_on_loopback_only_with_two_malloc_arenas():
  # worker_binary binds [::] on its own: every interface, for a whole run.
  process, port = execution.start_worker()
  try:
    deadline = time.monotonic() + 60
    while not loopback_bind.listening_addresses(process.pid, port):
      assert process.poll() is None and time.monotonic() < deadline
      time.sleep(0.05)
    assert loopback_bind.listening_addresses(process.pid, port) == {
        '127.0.0.1'}
    # And with two malloc arenas (`worker_processes.worker_environment`).
    with open(f'/proc/{process.pid}/environ', 'rb') as f:
      assert b'MALLOC_ARENA_MAX=2' in f.read().split(b'\0')
    context = execution.make_remote_context(f'127.0.0.1:{port}')
    with tff.framework.get_context_stack().install(context):
      assert _add_one(np.float32(1.0)) == 2.0
  finally:
    execution.stop_worker(process)


# Runs a computation on a local worker and leaves, past the block that stops
# that worker, 45 of its values referenced: TFF disposes of values in batches
# of 20 from `weakref` finalizers, so two batches call the stopped worker
# when Python runs the pending finalizers at exit, as after an interrupted
# round (CI printed that traceback after "Interrupted. ...").
_VALUES_OUTLIVE_THEIR_WORKER = r'''
import numpy as np
import tensorflow_federated as tff
from tff_fedrec.programs import execution

with execution.worker_execution_context():
  context = tff.framework.get_context_stack().current
  executor = context._executor_factory.create_executor({})
  held = [
      context._async_runner.run_coro_and_return_result(
          executor.create_value(np.int32(i), tff.TensorType(np.int32)))
      for i in range(45)
  ]
print('block ended')
'''


def test_values_that_outlive_their_stopped_worker_leave_no_traceback():
  result = subprocess.run(
      [sys.executable, '-c', _VALUES_OUTLIVE_THEIR_WORKER],
      capture_output=True, text=True, timeout=300,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'block ended' in result.stdout
  assert 'Traceback' not in result.stderr, result.stderr[-3000:]
