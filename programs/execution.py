"""TFF execution context backed by a worker process this program owns.

TFF's default local context starts `worker_binary` with `subprocess.Popen`
and stops it only from a `__del__`, so a crashed, interrupted or killed
program leaves the worker running (holding the caller's stdout open). Here the
program starts the same binary itself:

- the child gets PR_SET_PDEATHSIG=SIGKILL, so the kernel ends it when this
  process dies, even by SIGKILL. A fresh interpreter sets it and then execs
  the binary (`_EXEC_WITH_PDEATHSIG`): a `preexec_fn` would make Popen
  fork this multi-threaded process and run gRPC's fork handlers in the
  child, which has been seen to abort the child ("ev_epoll1_linux.cc Check
  failed: next_worker->state == KICKED") before the worker ever started;
- `worker_execution_context` stops it on every normal or exceptional exit;
- its output goes to a log file, never to the caller's pipes;
- a watchdog thread notices when it dies mid-run (it has been seen to
  segfault after many rounds) and raises `WorkerDiedError` in the main
  thread: TFF's client would otherwise retry the vanished executor forever.

The Python side talks to it over gRPC exactly as TFF's own local context does
(RemoteExecutor + SyncExecutionContext), so computations run unchanged.
"""

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Iterator, Optional

import grpc
import tensorflow_federated as tff

from tff_fedrec.programs import loopback_bind
from tff_fedrec.programs import worker_processes
from tff_fedrec.templates import cohorts

_PR_SET_PDEATHSIG = 1
_GRPC_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_GRPC_OPTIONS = [
    ('grpc.max_message_length', _GRPC_MAX_MESSAGE_BYTES),
    ('grpc.max_receive_message_length', _GRPC_MAX_MESSAGE_BYTES),
    ('grpc.max_send_message_length', _GRPC_MAX_MESSAGE_BYTES),
    # A worker just started listens within about 0.1 s, but gRPC's default
    # reconnect backoff (1 s, growing 1.6x) had the first connection wait
    # 3.3 s here; retry every 0.1 s, at most 1 s apart.
    ('grpc.initial_reconnect_backoff_ms', 100),
    ('grpc.min_reconnect_backoff_ms', 100),
    ('grpc.max_reconnect_backoff_ms', 1000),
]


class WorkerStartError(RuntimeError):
  """The TFF worker did not start or did not answer."""


class WorkerDiedError(RuntimeError):
  """The TFF worker process ended while the program was using it."""


def worker_binary_path() -> str:
  return os.path.join(os.path.dirname(tff.__file__), 'data', 'worker_binary')


# argv: PARENT_PID BINARY ARGS...; exits 1 if the parent already died (its
# death would then not reach the child).
_EXEC_WITH_PDEATHSIG = (
    'import ctypes, os, sys\n'
    f'ctypes.CDLL(None).prctl({_PR_SET_PDEATHSIG}, {int(signal.SIGKILL)})\n'
    'if os.getppid() != int(sys.argv[1]):\n'
    '  sys.exit(1)\n'
    'os.execv(sys.argv[2], sys.argv[2:])\n'
)


def _unused_port() -> int:
  with socket.socket() as sock:
    sock.bind(('127.0.0.1', 0))
    return sock.getsockname()[1]


def start_worker(
    *, port: Optional[int] = None, log_path: str = os.devnull
) -> tuple[subprocess.Popen, int]:
  """Starts `worker_binary --port=N` tied to this process, listening on
  127.0.0.1 only (`loopback_bind`; without a C compiler on every interface,
  said once on stderr); returns (proc, port)."""
  port = port or _unused_port()
  with open(log_path, 'ab') as log, _loopback_environment(port) as environment:
    process = subprocess.Popen(
        [sys.executable, '-I', '-S', '-c', _EXEC_WITH_PDEATHSIG,
         str(os.getpid()), worker_binary_path(), f'--port={port}'],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env=worker_processes.worker_environment(environment),
    )
  _wait_for_exec(process)
  return process, port


_warned_about_every_interface = False


@contextlib.contextmanager
def _loopback_environment(port: int) -> Iterator[dict]:
  """The environment of a local worker on `port`: its bind redirected to
  127.0.0.1; without a compiler this process's own environment."""
  global _warned_about_every_interface
  try:
    with loopback_bind.redirected_environment('127.0.0.1', port) as environment:
      yield environment
      return
  except loopback_bind.BindRedirectError as error:
    if not _warned_about_every_interface:
      _warned_about_every_interface = True
      print(
          f'warning: the local TFF worker listens on every interface (port '
          f'{port}), not only on 127.0.0.1: keeping it there needs a C '
          f'compiler, and {error}. Anyone who reaches this machine\'s port '
          'can run code in it while the run lasts; install gcc to close it.',
          file=sys.stderr, flush=True)
  yield dict(os.environ)


def _wait_for_exec(process: subprocess.Popen, timeout_seconds=30.0) -> None:
  """Returns once `process` runs `worker_binary` (the interpreter of
  `_EXEC_WITH_PDEATHSIG` has exec'd it), so from then on it is listed as a
  worker (`worker_processes`) like a binary started directly."""
  deadline = time.monotonic() + timeout_seconds
  while not worker_processes.is_running_worker(process.pid):
    if process.poll() is not None:
      raise WorkerStartError(
          f'{worker_binary_path()} did not start (exit status '
          f'{process.returncode}).'
      )
    if time.monotonic() > deadline:
      stop_worker(process)
      raise WorkerStartError(
          f'{worker_binary_path()} did not start within {timeout_seconds:.0f} s.'
      )
    time.sleep(0.001)


def stop_worker(process: subprocess.Popen) -> None:
  if process.poll() is None:
    process.terminate()
    try:
      process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()


# How long a worker address may refuse connections (nothing listens there),
# or accept and close them unanswered, before the start fails, when the
# timeout is longer: a worker being started listens within about 0.1 s.
_REFUSED_SECONDS = 5.0

_START_A_WORKER = (
    'Start one with `python -m tff_fedrec.programs.worker --port=PORT` and '
    'point --workers at it.'
)

_FRAME_HEADER_BYTES = 9
_SETTINGS_FRAME_TYPE = 4
# What a gRPC client sends first (RFC 9113, section 3.4): the connection
# preface, then an empty SETTINGS frame (length 0, no flags, stream 0).
_HTTP2_CLIENT_PREFACE = b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n' + bytes(
    [0, 0, 0, _SETTINGS_FRAME_TYPE, 0, 0, 0, 0, 0]
)


def _greet(address: str) -> tuple[str, bytes]:
  """Opens a connection to HOST:PORT as gRPC does; classifies the answer.

  Returns (kind, the first bytes the peer sent), kind one of: 'refused'
  (nothing listens); 'closed' (accepted, then closed or reset without a
  byte); 'http2' (a SETTINGS frame, as every HTTP/2 server sends first);
  'other' (bytes that are not HTTP/2: no gRPC server, or one behind TLS);
  'unknown' (unreachable, or silent for a second: gRPC's own wait decides).
  """
  host, _, port = address.rpartition(':')
  answer = b''
  try:
    with socket.create_connection(
        (host.strip('[]'), int(port)), timeout=1
    ) as sock:
      sock.sendall(_HTTP2_CLIENT_PREFACE)
      while len(answer) < _FRAME_HEADER_BYTES:
        received = sock.recv(64)
        if not received:
          break
        answer += received
  except ConnectionRefusedError:
    return 'refused', b''
  except ConnectionResetError:
    pass  # Judged on what came before the reset.
  except OSError:
    return 'unknown', answer
  if not answer:
    return 'closed', b''
  if (len(answer) >= _FRAME_HEADER_BYTES
      and answer[3] == _SETTINGS_FRAME_TYPE
      and answer[5:9] == bytes(4)):
    return 'http2', answer
  return 'other', answer


def _wait_until_ready(stub, address: str, timeout_seconds: float) -> None:
  """Waits for the gRPC connection to `address`; fails at once where a peer
  answers that does not speak gRPC, and after `_REFUSED_SECONDS` where
  nothing answers."""
  start = time.monotonic()
  failing_since = None
  while not stub.is_ready:
    now = time.monotonic()
    kind, answer = _greet(address)
    if kind == 'other':
      raise WorkerStartError(
          f'{address} answers, but it is not a TFF worker: it does not speak '
          f'gRPC (its answer began {answer[:24]!r}). {_START_A_WORKER}'
      )
    if kind in ('refused', 'closed'):
      failing_since = failing_since or now
      seconds = now - failing_since
      if seconds >= min(_REFUSED_SECONDS, timeout_seconds):
        if kind == 'refused':
          raise WorkerStartError(
              f'Nothing listens at {address}: the connection was refused for '
              f'{seconds:.0f} s. Start the worker there (`python -m '
              'tff_fedrec.programs.worker --port=PORT`), or fix --workers.'
          )
        raise WorkerStartError(
            f'No TFF worker answers at {address}: for {seconds:.0f} s it '
            'accepted connections and closed them without a word (so does '
            f'an SSH tunnel with nothing at its far end). {_START_A_WORKER}'
        )
    else:
      failing_since = None
    if now - start > timeout_seconds:
      raise WorkerStartError(
          f'The TFF worker at {address} did not answer within '
          f'{timeout_seconds:.0f} s. Check that it is running (`python -m '
          'tff_fedrec.programs.worker --port=PORT` there) and reachable.'
      )
    time.sleep(0.05)


# A method of TFF's executor service, and a request that is no protobuf
# message (a varint cut short).
_EXECUTOR_SERVICE_METHOD = '/tensorflow_federated.v0.ExecutorGroup/Dispose'
_UNPARSEABLE_REQUEST = b'\xff'


def _check_executor_service(channel, address: str, timeout_seconds: float):
  """Fails unless `address` serves TFF's executor service.

  Sends the service's Dispose method a request that cannot be parsed: a
  server with that method rejects it while parsing (INTERNAL), before any
  of its code runs, so a TFF worker does and logs nothing (an empty but
  valid Dispose logs a warning); any other gRPC server answers
  UNIMPLEMENTED.
  """
  probe = channel.unary_unary(_EXECUTOR_SERVICE_METHOD)
  try:
    probe(_UNPARSEABLE_REQUEST, timeout=timeout_seconds)
  except grpc.RpcError as error:
    code = error.code()
    if code == grpc.StatusCode.UNIMPLEMENTED:
      raise WorkerStartError(
          f'{address} answers gRPC, but it is not a TFF worker: it has no TFF '
          f'executor service (UNIMPLEMENTED). {_START_A_WORKER}'
      ) from None
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
      raise WorkerStartError(
          f'The TFF worker at {address} did not answer within '
          f'{timeout_seconds:.0f} s.'
      ) from None
    # Other codes (INTERNAL from a TFF worker) say the method is there.


def _connect(address: str, ready_timeout_seconds: float):
  channel = grpc.insecure_channel(address, _GRPC_OPTIONS)
  stub = tff.framework.RemoteExecutorGrpcStub(channel)
  _wait_until_ready(stub, address, ready_timeout_seconds)
  _check_executor_service(channel, address, ready_timeout_seconds)

  def stack_fn(cardinalities):
    # Computations with no client-placed argument still need a cardinality.
    cardinalities.setdefault(tff.CLIENTS, 0)
    executor = tff.framework.RemoteExecutor(stub)
    executor.set_cardinalities(cardinalities)
    return executor

  return stub, tff.framework.ResourceManagingExecutorFactory(stack_fn)


def make_remote_context(
    address: str, *, ready_timeout_seconds: float = 60.0
) -> tff.framework.SyncExecutionContext:
  """A synchronous TFF context whose computations run on the worker at `address`."""
  _, executor_factory = _connect(address, ready_timeout_seconds)
  return tff.framework.SyncExecutionContext(
      executor_fn=executor_factory,
      compiler_fn=tff.backends.native.compiler.desugar_and_transform_to_native,
      transform_args=tff.tensorflow.transform_args,
      transform_result=tff.tensorflow.transform_result,
  )


def parse_worker_addresses(
    workers: Sequence[str], *, allow_insecure_remote: bool = False
) -> list[str]:
  """Checks `HOST:PORT` addresses; refuses hosts other than loopback unless
  `allow_insecure_remote` (the worker service has no authentication or TLS:
  anyone who reaches its port can run code in it)."""
  if not workers:
    raise ValueError(
        '--executor=remote needs --workers=HOST:PORT[,HOST:PORT...]; start '
        'a worker with `python -m tff_fedrec.programs.worker --port=PORT`.'
    )
  addresses = []
  for worker in workers:
    host, separator, port = worker.strip().rpartition(':')
    if not separator or not host or not port.isdigit() or not (
        0 < int(port) < 65536
    ):
      raise ValueError(
          f'Worker address {worker!r} is not HOST:PORT (e.g. 127.0.0.1:8000).'
      )
    try:
      loopback = ipaddress.ip_address(host.strip('[]')).is_loopback
    except ValueError:
      loopback = host == 'localhost'
    if not loopback and not allow_insecure_remote:
      raise ValueError(
          f'Worker {worker} is not on this machine, and TFF workers speak '
          'plain gRPC without authentication or TLS. Reach it through an SSH '
          'tunnel or a private network and pass --allow_insecure_remote to '
          'accept the risk.'
      )
    addresses.append(f'{host}:{port}')
  return addresses


def make_workers_context(
    addresses: Sequence[str], *, ready_timeout_seconds: float = 60.0
):
  """TFF's mergeable-computation context over the workers at `addresses`.

  Each round's clients are split into one share per worker; a computation
  runs its part up to the aggregation on every share in parallel, the
  partial aggregates are merged, and the rest runs once (TFF
  `MergeableCompExecutionContext`). Returns (context, the workers' gRPC stubs
  in `addresses`' order).
  """
  stubs, contexts = [], []
  for address in addresses:
    stub, executor_factory = _connect(address, ready_timeout_seconds)
    stubs.append(stub)
    contexts.append(
        tff.framework.AsyncExecutionContext(
            executor_fn=executor_factory,
            compiler_fn=(
                tff.backends.native.compiler.desugar_and_transform_to_native
            ),
            transform_args=tff.tensorflow.transform_args,
            transform_result=tff.tensorflow.transform_result,
        )
    )
  context = tff.framework.MergeableCompExecutionContext(
      async_contexts=contexts,
      compiler_fn=tff.backends.native.compile_to_mergeable_comp_form,
      transform_args=tff.tensorflow.transform_args,
      transform_result=tff.tensorflow.transform_result,
  )
  return context, stubs


def _describe_exit(returncode: int) -> str:
  if returncode < 0:
    return f'was killed by signal {signal.Signals(-returncode).name}'
  return f'exited with code {returncode}'


def quiet_disposal_errors_hook(previous):
  """A `sys.unraisablehook` that drops gRPC errors and passes the rest on.

  Once a worker is gone, TFF's RemoteExecutor still disposes of the values
  it held there, from weakref finalizers; each fails with a gRPC error
  that Python prints as "Exception ignored in ..." with a traceback,
  burying the `WorkerDiedError` message that names the worker. A gRPC
  error raised where nothing can catch it (a finalizer) is never the
  user's to act on: a computation on a broken worker fails on its own, and
  the watchdog names it. `_default_context_watched` installs this hook for
  the whole block, since a disposal can fail before the watchdog's check
  does (a remote worker counts as gone only after `unreachable_seconds`).
  """

  def hook(unraisable):
    if isinstance(unraisable.exc_value, grpc.RpcError):
      return
    previous(unraisable)

  return hook


def quiet_disposal_errors_at_exit_hook(previous):
  """A `sys.excepthook` that drops gRPC errors of finalizers run at exit.

  `weakref` runs the finalizers still pending at exit itself and reports
  their errors through `sys.excepthook`, not `sys.unraisablehook`. TFF's
  remote values dispose of themselves in batches from such finalizers, so a
  value still referenced when the run ends (an interrupted round's frames
  hold some) calls a worker that `worker_execution_context` has stopped, and
  Python prints that call's traceback after the run's last message (CI,
  issue 40). Only errors raised from `weakref`'s exit function are dropped:
  a gRPC error that ends the program is still printed.
  """

  def hook(exc_type, exc_value, exc_traceback):
    outermost = exc_traceback.tb_frame.f_code if exc_traceback else None
    if (isinstance(exc_value, grpc.RpcError)
        and outermost is weakref.finalize._exitfunc.__code__):
      return
    previous(exc_type, exc_value, exc_traceback)

  hook.drops_disposal_errors_at_exit = True
  return hook


@contextlib.contextmanager
def _default_context_watched(
    context, check: Callable[[], Optional[str]], poll_seconds: float
) -> Iterator[None]:
  """Installs `context` as TFF's default; while the block runs, a watchdog
  thread calls `check()` every `poll_seconds` and, when it returns a
  message, raises `WorkerDiedError(message)` in the main thread (via SIGUSR1),
  interrupting a computation that TFF would otherwise retry forever. SIGTERM
  becomes SystemExit so that callers' cleanup runs."""
  stopping = threading.Event()
  failure = []
  previous_handlers = {
      signal.SIGTERM: signal.getsignal(signal.SIGTERM),
      signal.SIGUSR1: signal.getsignal(signal.SIGUSR1),
  }

  def _exit_on_sigterm(signum, frame):
    del frame
    raise SystemExit(128 + signum)

  def _raise_worker_died(signum, frame):
    del signum, frame
    raise WorkerDiedError(failure[0])

  def _watch():
    while not stopping.wait(poll_seconds):
      message = check()
      if message is not None:
        if not stopping.is_set():
          failure.append(message)
          os.kill(os.getpid(), signal.SIGUSR1)
        return

  signal.signal(signal.SIGTERM, _exit_on_sigterm)
  signal.signal(signal.SIGUSR1, _raise_worker_died)
  previous_hook = sys.unraisablehook
  sys.unraisablehook = quiet_disposal_errors_hook(previous_hook)
  if not getattr(sys.excepthook, 'drops_disposal_errors_at_exit', False):
    # For the rest of the process: a stopped worker's values are disposed
    # of at exit after clean runs too.
    sys.excepthook = quiet_disposal_errors_at_exit_hook(sys.excepthook)
  exited_cleanly = False
  watchdog = threading.Thread(target=_watch, daemon=True)
  context_stack = tff.framework.get_context_stack()
  previous_context = context_stack.current
  try:
    context_stack.set_default_context(context)
    watchdog.start()
    yield
    exited_cleanly = True
  finally:
    stopping.set()
    # Joined before the handlers are restored: SIGUSR1's default would kill
    # the process.
    if watchdog.is_alive():
      watchdog.join()
    context_stack.set_default_context(previous_context)
    for signum, handler in previous_handlers.items():
      signal.signal(signum, handler)
    if exited_cleanly:
      # After an error the hook stays for the rest of the process: the
      # finalizers run as the error unwinds and at exit.
      sys.unraisablehook = previous_hook


@contextlib.contextmanager
def worker_execution_context(
    *, log_path: str = os.devnull, poll_seconds: float = 0.5
) -> Iterator[int]:
  """Installs a local worker as TFF's default context; yields its PID.

  The worker is stopped and the previous context restored when the block
  exits, also on exceptions and KeyboardInterrupt; SIGTERM is turned into
  SystemExit so that it stops too. If the worker dies inside the block,
  `WorkerDiedError` is raised in the main thread, interrupting a computation
  that would otherwise wait for it forever. Rounds in cohorts take a second
  lane through a second context on the worker (`cohorts.allow_two_lanes`).
  """
  process, port = start_worker(log_path=log_path)

  def check():
    if process.poll() is None:
      return None
    return (
        f'The TFF worker (pid {process.pid}) '
        f'{_describe_exit(process.returncode)} during a computation; its log '
        f'is {log_path}.'
    )

  try:
    address = f'127.0.0.1:{port}'
    context = make_remote_context(address)
    # Rounds in cohorts may run a second cohort through a second context
    # on this worker (`cohorts.allow_two_lanes`).
    cohorts.allow_two_lanes(context, lambda: make_remote_context(address))
    with _default_context_watched(context, check, poll_seconds):
      yield process.pid
  finally:
    stop_worker(process)


@contextlib.contextmanager
def remote_workers_context(
    addresses: Sequence[str],
    *,
    ready_timeout_seconds: float = 60.0,
    poll_seconds: float = 0.5,
    unreachable_seconds: float = 5.0,
) -> Iterator[None]:
  """Installs `make_workers_context(addresses)` as TFF's default context.

  The workers belong to someone else, so nothing is started or stopped here.
  A worker whose connection stays down for `unreachable_seconds` raises
  `WorkerDiedError` naming it in the main thread.
  """
  context, stubs = make_workers_context(
      addresses, ready_timeout_seconds=ready_timeout_seconds
  )
  down_since = {}

  def check():
    now = time.monotonic()
    for address, stub in zip(addresses, stubs):
      if stub.is_ready:
        down_since.pop(address, None)
      elif now - down_since.setdefault(address, now) >= unreachable_seconds:
        return (
            f'The TFF worker at {address} stopped answering for '
            f'{unreachable_seconds:.0f} s during a computation.'
        )
    return None

  with _default_context_watched(context, check, poll_seconds):
    yield
