r"""Runs a TFF executor service (worker) for `--executor=remote` runs.

  python -m tff_fedrec.programs.worker --port=8000  # this machine only
  python -m tff_fedrec.programs.worker --port=8000 --listen=0.0.0.0

runs TFF's own `worker_binary --port=8000` (shipped in the
tensorflow-federated wheel), which serves computations over gRPC until it is
stopped. It has no authentication and no TLS: anyone who reaches the port can
run code in it. So it listens on `--listen`, 127.0.0.1 unless told otherwise;
the training program refuses addresses off this machine without
`--allow_insecure_remote`.

Where it listens. TFF 0.87's binary has no flag for an address: it always
binds `[::]:PORT`, every interface (`servers.cc`). Here it starts with a
one-function library preloaded (`loopback_bind`, compiled with the machine's
C compiler into a private temporary folder) whose `bind()` puts `--listen` in
place of that wildcard. For an IPv4 address it fails the IPv6 wildcard bind,
and gRPC falls back to an IPv4 socket, which gets the address. It also drops
the binary's SO_REUSEPORT there, so no second worker can share the port.
`--listen=::` is the binary's own bind and needs no compiler. Once the
binary listens, this program reads its listening sockets from /proc and
prints the one line that says where it listens (with a warning off
loopback); a socket anywhere else stops the worker. The binary's own log
line still says `listening on [::]:PORT`: the address it asked for.

A taken port. Before the binary starts, this program binds `--listen` and
`--port` itself once, without SO_REUSEPORT, and exits with status 1 and a
message naming the port if that fails. The binary on its own would log a
gRPC error and exit 0; beside another worker_binary, which also sets
SO_REUSEPORT, it would start, and the kernel would split new connections
between the two. A binary
that still ends before it listens exits this program with status 1 too.

This program stays the binary's parent: it passes SIGINT, SIGTERM and SIGHUP
on, the binary gets SIGKILL if this program dies, and it ends the way the
binary ended. It imports no TensorFlow (a 5 s import), and so starts no
threads before it forks the binary.
"""

import contextlib
import ctypes
import importlib.util
import ipaddress
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
from typing import Iterator, Optional

from absl import app
from absl import flags

from tff_fedrec.programs import loopback_bind
from tff_fedrec.programs import worker_processes


def _is_ip_address(value: str) -> bool:
  try:
    ipaddress.ip_address(value)
  except ValueError:
    return False
  return '%' not in value  # A scoped address would need its interface.


_PORT = flags.DEFINE_integer('port', None, 'Port to serve on.', lower_bound=1,
                             upper_bound=65535)
_LISTEN = flags.DEFINE_string(
    'listen', '127.0.0.1',
    'IP address to listen on: 127.0.0.1 (the default) serves this machine '
    'only; 0.0.0.0 (every IPv4 interface), :: (every interface) or one '
    'address of this machine serves a network, where anyone who reaches it '
    'can run code in the worker.',
)
flags.mark_flag_as_required('port')
flags.register_validator(
    'listen', _is_ip_address,
    message='--listen must be an IP address of this machine, e.g. 127.0.0.1, '
    '0.0.0.0 or ::.',
)


_PR_SET_PDEATHSIG = 1
_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_LISTEN_TIMEOUT_SECONDS = 120.0


class _WorkerError(Exception):
  """The worker cannot start; the message says why and what to do."""


def _worker_binary_path() -> str:
  # `execution.worker_binary_path()` without importing tensorflow_federated.
  package = importlib.util.find_spec('tensorflow_federated')
  if package is None:
    raise _WorkerError('tensorflow_federated, whose wheel ships '
                       'worker_binary, is not installed in this Python.')
  return os.path.join(os.path.dirname(package.origin), 'data', 'worker_binary')


def _family(address: str) -> socket.AddressFamily:
  return socket.AF_INET6 if ':' in address else socket.AF_INET


def _host_port(address: str, port: int) -> str:
  return f'[{address}]:{port}' if ':' in address else f'{address}:{port}'


def _check_can_listen(address: str, port: int) -> None:
  """Binds `address`:`port` once and releases it, as the binary will.

  SO_REUSEADDR as gRPC sets it (a closed connection's TIME_WAIT does not
  count); no SO_REUSEPORT, so a port that another worker_binary holds counts
  as taken.
  """
  try:
    with socket.socket(_family(address), socket.SOCK_STREAM) as probe:
      probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      if address == '::':  # The binary's dual-stack bind: IPv4 too.
        probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
      probe.bind((address, port))
  except OSError as error:
    raise _WorkerError(_bind_problem(address, port, error)) from None


def _bind_problem(address: str, port: int, error: OSError) -> str:
  where = _host_port(address, port)
  if isinstance(error, PermissionError):
    return (f'cannot listen on {where}: port {port} needs privileges; pass '
            '--port=1024 or above.')
  if error.errno == 98:  # EADDRINUSE
    return (f'port {port} is already in use at {where} (another worker, or '
            f'another program, holds it). Pass another --port, or stop what '
            f"holds it (`ss -ltnp 'sport = :{port}'` shows it).")
  if error.errno == 99:  # EADDRNOTAVAIL
    return (f'{address} is not an address of this machine, so the worker '
            'cannot listen on it. Pass --listen=127.0.0.1 (this machine '
            'only), --listen=0.0.0.0 (every interface) or an address that '
            '`ip address` shows.')
  return f'cannot listen on {where}: {error.strerror}.'


@contextlib.contextmanager
def _bind_shim_environment(address: str, port: int) -> Iterator[dict]:
  """The binary's environment, its bind redirected to `address`
  (`loopback_bind`); `::` is the binary's own bind."""
  try:
    with loopback_bind.redirected_environment(address, port) as environment:
      yield environment
  except loopback_bind.BindRedirectError as error:
    raise _WorkerError(
        f'--listen={address} needs a C compiler, and {error}: TFF\'s '
        'worker_binary has no flag for an address and listens on every '
        'interface, so this program compiles a small library that redirects '
        'its bind. Install one (e.g. `apt-get install gcc`), or pass '
        '--listen=:: to let it listen on every interface.'
    ) from None


def _die_with_parent(parent_pid: int) -> None:
  """Runs in the forked child before the exec (this process has no other
  threads): SIGKILL when the parent dies, even by SIGKILL."""
  ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
  if os.getppid() != parent_pid:  # It died before the prctl.
    os._exit(1)


def _wait_until_listening(
    process: subprocess.Popen, address: str, port: int
) -> Optional[set[str]]:
  """The addresses the binary listens on once it listens; None if it ended
  first. Stops it and raises `_WorkerError` if it listens anywhere but
  `address`, or not within `_LISTEN_TIMEOUT_SECONDS`."""
  deadline = time.monotonic() + _LISTEN_TIMEOUT_SECONDS
  while process.poll() is None:
    listening = loopback_bind.listening_addresses(process.pid, port)
    if listening:
      if {ipaddress.ip_address(a) for a in listening} != {
          ipaddress.ip_address(address)}:
        process.kill()
        process.wait()
        found = ', '.join(_host_port(a, port) for a in sorted(listening))
        raise _WorkerError(
            f'worker_binary listened on {found}, not on '
            f'{_host_port(address, port)} as --listen asked (its bind was not '
            'redirected); stopped it.'
        )
      return listening
    if time.monotonic() > deadline:
      process.kill()
      process.wait()
      raise _WorkerError(
          f'worker_binary did not listen on {_host_port(address, port)} '
          f'within {_LISTEN_TIMEOUT_SECONDS:.0f} s; stopped it.'
      )
    time.sleep(0.02)
  return None


def _listening_line(address: str, port: int, pid: int) -> str:
  """The line printed once the worker listens: where, and who can reach it."""
  where = _host_port(address, port)
  own_log = (
      '' if address == '::'
      else f' (its own log says [::]:{port}, the address it asked for)'
  )
  start = f'TFF worker (worker_binary, pid {pid}) listens on {where}{own_log}'
  if ipaddress.ip_address(address).is_loopback:
    return f'{start}: loopback, only this machine can reach it.'
  if ipaddress.ip_address(address).is_unspecified:
    scope = 'every interface' if address == '::' else 'every IPv4 interface'
    start = f'{start}, on {scope}'
  return (
      f'{start}. WARNING: it has no authentication or TLS: anyone who can '
      f'reach {where} can run any code in it, as user {_user_name()}. Serve '
      'only a private network, or use --listen=127.0.0.1 and an SSH tunnel.'
  )


def _user_name() -> str:
  try:
    return pwd.getpwuid(os.getuid()).pw_name
  except KeyError:  # A uid without a passwd entry (some containers).
    return f'uid {os.getuid()}'


def _end_as(process: subprocess.Popen, forwarded: list[int]) -> None:
  """Exits the way the binary ended: by the signal passed on to it, or with
  its status (128 + N for a signal it got otherwise, with a message)."""
  status = process.returncode
  if status < 0:
    signum = -status
    if signum in forwarded:
      signal.signal(signum, signal.SIG_DFL)
      os.kill(os.getpid(), signum)
    print(f'error: worker_binary (pid {process.pid}) was killed by '
          f'{signal.Signals(signum).name}.', file=sys.stderr, flush=True)
    sys.exit(128 + signum)
  if status:
    print(f'error: worker_binary (pid {process.pid}) exited with status '
          f'{status}.', file=sys.stderr, flush=True)
  sys.exit(status)


def _serve(address: str, port: int) -> None:
  _check_can_listen(address, port)
  forwarded = []
  with _bind_shim_environment(address, port) as environment:
    process = subprocess.Popen(
        [_worker_binary_path(), f'--port={port}'],
        env=worker_processes.worker_environment(environment),
        stdin=subprocess.DEVNULL,
        preexec_fn=lambda parent=os.getpid(): _die_with_parent(parent),
    )

    def forward(signum, frame):
      del frame
      forwarded.append(signum)
      process.send_signal(signum)

    for signum in _FORWARDED_SIGNALS:
      # An ignored signal (SIGINT of a background job) stays ignored, as
      # it is in the binary.
      if signal.getsignal(signum) is not signal.SIG_IGN:
        signal.signal(signum, forward)
    listening = _wait_until_listening(process, address, port)
  if listening is None and not forwarded:
    raise _WorkerError(
        f'worker_binary (pid {process.pid}) exited with status '
        f'{process.returncode} before it listened on '
        f'{_host_port(address, port)}; its messages are above.'
    )
  if listening is not None:
    print(_listening_line(address, port, process.pid), flush=True)
    process.wait()
  _end_as(process, forwarded)


def main(argv):
  del argv
  address = str(ipaddress.ip_address(_LISTEN.value))
  try:
    _serve(address, _PORT.value)
  except _WorkerError as error:
    print(f'error: {error}', file=sys.stderr, flush=True)
    sys.exit(1)


if __name__ == '__main__':
  app.run(main)
