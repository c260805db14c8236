"""TFF execution context backed by a worker process this program owns.

TFF's default local context starts `worker_binary` with `subprocess.Popen`
and stops it only from a `__del__`, so a crashed, interrupted or killed
program leaves the worker running (holding the caller's stdout open). Here the
program starts the same binary itself:

- the child gets PR_SET_PDEATHSIG=SIGKILL, so the kernel ends it when this
  process dies, even by SIGKILL;
- `worker_execution_context` stops it on every normal or exceptional exit;
- its output goes to a log file, never to the caller's pipes;
- a watchdog thread notices when it dies mid-run (it has been seen to
  segfault after many rounds) and raises `WorkerDiedError` in the main
  thread: TFF's client would otherwise retry the vanished executor forever.

The Python side talks to it over gRPC exactly as TFF's own local context does
(RemoteExecutor + SyncExecutionContext), so computations run unchanged.
"""

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from typing import Iterator, Optional

import grpc
import tensorflow_federated as tff

_PR_SET_PDEATHSIG = 1
_GRPC_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_GRPC_OPTIONS = [
    ('grpc.max_message_length', _GRPC_MAX_MESSAGE_BYTES),
    ('grpc.max_receive_message_length', _GRPC_MAX_MESSAGE_BYTES),
    ('grpc.max_send_message_length', _GRPC_MAX_MESSAGE_BYTES),
]


class WorkerStartError(RuntimeError):
  """The TFF worker did not start or did not answer."""


class WorkerDiedError(RuntimeError):
  """The TFF worker process ended while the program was using it."""


def worker_binary_path() -> str:
  return os.path.join(os.path.dirname(tff.__file__), 'data', 'worker_binary')


def _die_with_parent() -> None:
  libc = ctypes.CDLL('libc.so.6', use_errno=True)
  libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _unused_port() -> int:
  with socket.socket() as sock:
    sock.bind(('127.0.0.1', 0))
    return sock.getsockname()[1]


def start_worker(
    *, port: Optional[int] = None, log_path: str = os.devnull
) -> tuple[subprocess.Popen, int]:
  """Starts `worker_binary --port=N` tied to this process; returns (proc, port)."""
  port = port or _unused_port()
  with open(log_path, 'ab') as log:
    process = subprocess.Popen(
        [worker_binary_path(), f'--port={port}'],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        preexec_fn=_die_with_parent,
    )
  return process, port


def stop_worker(process: subprocess.Popen) -> None:
  if process.poll() is None:
    process.terminate()
    try:
      process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()


def _wait_until_ready(stub, address: str, timeout_seconds: float) -> None:
  deadline = time.monotonic() + timeout_seconds
  while not stub.is_ready:
    if time.monotonic() > deadline:
      raise WorkerStartError(
          f'The TFF worker at {address} did not answer within '
          f'{timeout_seconds:.0f} s. Check that it is running '
          f'({worker_binary_path()} --port=PORT) and reachable.'
      )
    time.sleep(0.05)


def make_remote_context(
    address: str, *, ready_timeout_seconds: float = 60.0
) -> tff.framework.SyncExecutionContext:
  """A synchronous TFF context whose computations run on the worker at `address`."""
  channel = grpc.insecure_channel(address, _GRPC_OPTIONS)
  stub = tff.framework.RemoteExecutorGrpcStub(channel)
  _wait_until_ready(stub, address, ready_timeout_seconds)

  def stack_fn(cardinalities):
    # Computations with no client-placed argument still need a cardinality.
    cardinalities.setdefault(tff.CLIENTS, 0)
    executor = tff.framework.RemoteExecutor(stub)
    executor.set_cardinalities(cardinalities)
    return executor

  return tff.framework.SyncExecutionContext(
      executor_fn=tff.framework.ResourceManagingExecutorFactory(stack_fn),
      compiler_fn=tff.backends.native.compiler.desugar_and_transform_to_native,
      transform_args=tff.tensorflow.transform_args,
      transform_result=tff.tensorflow.transform_result,
  )


def _describe_exit(returncode: int) -> str:
  if returncode < 0:
    return f'was killed by signal {signal.Signals(-returncode).name}'
  return f'exited with code {returncode}'


@contextlib.contextmanager
def worker_execution_context(
    *, log_path: str = os.devnull, poll_seconds: float = 0.5
) -> Iterator[int]:
  """Installs a local worker as TFF's default context; yields its PID.

  The worker is stopped and the previous context restored when the block
  exits, also on exceptions and KeyboardInterrupt; SIGTERM is turned into
  SystemExit so that it stops too. If the worker dies inside the block,
  `WorkerDiedError` is raised in the main thread (via SIGUSR1), interrupting
  a computation that would otherwise wait for it forever.
  """
  process, port = start_worker(log_path=log_path)
  stopping = threading.Event()
  previous_handlers = {
      signal.SIGTERM: signal.getsignal(signal.SIGTERM),
      signal.SIGUSR1: signal.getsignal(signal.SIGUSR1),
  }

  def _exit_on_sigterm(signum, frame):
    del frame
    raise SystemExit(128 + signum)

  def _raise_worker_died(signum, frame):
    del signum, frame
    raise WorkerDiedError(
        f'The TFF worker (pid {process.pid}) {_describe_exit(process.returncode)}'
        f' during a computation; its log is {log_path}.'
    )

  def _watch():
    while not stopping.wait(poll_seconds):
      if process.poll() is not None:
        if not stopping.is_set():
          os.kill(os.getpid(), signal.SIGUSR1)
        return

  signal.signal(signal.SIGTERM, _exit_on_sigterm)
  signal.signal(signal.SIGUSR1, _raise_worker_died)
  watchdog = threading.Thread(target=_watch, daemon=True)
  context_stack = tff.framework.get_context_stack()
  previous_context = context_stack.current
  try:
    context_stack.set_default_context(make_remote_context(f'127.0.0.1:{port}'))
    watchdog.start()
    yield process.pid
  finally:
    stopping.set()
    # Joined before the handlers are restored: SIGUSR1's default would kill
    # the process.
    if watchdog.is_alive():
      watchdog.join()
    context_stack.set_default_context(previous_context)
    stop_worker(process)
    for signum, handler in previous_handlers.items():
      signal.signal(signum, handler)
