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
one-function library preloaded (`_BIND_SHIM_C`, compiled with the machine's C
compiler into a private temporary folder) whose `bind()` puts `--listen` in
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
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Iterator, Optional

from absl import app
from absl import flags


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

_ADDRESS_VARIABLE = 'TFF_FEDREC_LISTEN_ADDRESS'
_PORT_VARIABLE = 'TFF_FEDREC_LISTEN_PORT'

_BIND_SHIM_C = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

/* The wildcard address on port $%(port)s becomes $%(address)s. */
int bind(int fd, const struct sockaddr *addr, socklen_t len) {
  bind_fn real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
  const char *host = getenv("%(address)s"), *port = getenv("%(port)s");
  struct sockaddr_in v4;
  struct sockaddr_in6 v6;
  int off = 0;
  if (host == NULL || port == NULL) return real_bind(fd, addr, len);
  if (addr->sa_family == AF_INET6 && len >= sizeof v6) {
    memcpy(&v6, addr, sizeof v6);
    if (ntohs(v6.sin6_port) != atoi(port) ||
        !IN6_IS_ADDR_UNSPECIFIED(&v6.sin6_addr)) {
      return real_bind(fd, addr, len);
    }
    if (inet_pton(AF_INET6, host, &v6.sin6_addr) != 1) {
      errno = EADDRNOTAVAIL; /* gRPC then tries an IPv4 socket. */
      return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &off, sizeof off);
    return real_bind(fd, (const struct sockaddr *)&v6, sizeof v6);
  }
  if (addr->sa_family == AF_INET && len >= sizeof v4) {
    memcpy(&v4, addr, sizeof v4);
    if (ntohs(v4.sin_port) != atoi(port) ||
        v4.sin_addr.s_addr != htonl(INADDR_ANY)) {
      return real_bind(fd, addr, len);
    }
    if (inet_pton(AF_INET, host, &v4.sin_addr) != 1) {
      errno = EADDRNOTAVAIL;
      return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &off, sizeof off);
    return real_bind(fd, (const struct sockaddr *)&v4, sizeof v4);
  }
  return real_bind(fd, addr, len);
}
""" % {'address': _ADDRESS_VARIABLE, 'port': _PORT_VARIABLE}

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
  """The binary's environment: `_BIND_SHIM_C` preloaded, compiled into a
  private folder that lasts while the block runs (the binary has loaded it
  by the time it listens). `::` is the binary's own bind: no shim."""
  environment = dict(os.environ)
  if address == '::':
    yield environment
    return
  compiler = shlex.split(os.environ.get('CC', '')) or [
      shutil.which('cc') or shutil.which('gcc') or 'cc']
  if not shutil.which(compiler[0]):
    raise _WorkerError(
        f'--listen={address} needs a C compiler ({compiler[0]}): TFF\'s '
        'worker_binary has no flag for an address and listens on every '
        'interface, so this program compiles a small library that redirects '
        'its bind. Install one (e.g. `apt-get install gcc`), or pass '
        '--listen=:: to let it listen on every interface.'
    )
  with tempfile.TemporaryDirectory(prefix='tff_fedrec_worker_') as folder:
    library = os.path.join(folder, 'bind_shim.so')
    compiled = subprocess.run(
        [*compiler, '-shared', '-fPIC', '-O2', '-o', library, '-x', 'c', '-',
         '-ldl'],
        input=_BIND_SHIM_C, capture_output=True, text=True, check=False,
    )
    if compiled.returncode != 0:
      raise _WorkerError(
          f'{shlex.join(compiler)} could not compile the bind library for '
          f'--listen ({compiled.stderr.strip()}); pass --listen=:: to let '
          'the worker listen on every interface without it.'
      )
    preload = os.environ.get('LD_PRELOAD')
    environment['LD_PRELOAD'] = f'{library} {preload}' if preload else library
    environment[_ADDRESS_VARIABLE] = address
    environment[_PORT_VARIABLE] = str(port)
    yield environment


def _die_with_parent(parent_pid: int) -> None:
  """Runs in the forked child before the exec (this process has no other
  threads): SIGKILL when the parent dies, even by SIGKILL."""
  ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
  if os.getppid() != parent_pid:  # It died before the prctl.
    os._exit(1)


def _decode_proc_address(hex_address: str, family: socket.AddressFamily) -> str:
  # /proc/net/tcp* writes each 32-bit word of the address in host byte order.
  words = [bytes.fromhex(hex_address[i:i + 8])
           for i in range(0, len(hex_address), 8)]
  if sys.byteorder == 'little':
    words = [word[::-1] for word in words]
  return socket.inet_ntop(family, b''.join(words))


def _listening_addresses(pid: int, port: int) -> set[str]:
  """The addresses on which process `pid` has a TCP socket listening on
  `port`, read from /proc; empty if it has none (or has ended)."""
  inodes = set()
  try:
    for fd in os.listdir(f'/proc/{pid}/fd'):
      with contextlib.suppress(OSError):  # The fd closed meanwhile.
        target = os.readlink(f'/proc/{pid}/fd/{fd}')
        if target.startswith('socket:['):
          inodes.add(target[len('socket:['):-1])
    addresses = set()
    for table, family in (('tcp', socket.AF_INET), ('tcp6', socket.AF_INET6)):
      with open(f'/proc/{pid}/net/{table}') as f:
        next(f)
        for line in f:
          fields = line.split()
          local_address, local_port = fields[1].split(':')
          if (fields[3] == '0A' and int(local_port, 16) == port  # LISTEN
              and fields[9] in inodes):
            addresses.add(_decode_proc_address(local_address, family))
  except OSError:  # The process ended.
    return set()
  return addresses


def _wait_until_listening(
    process: subprocess.Popen, address: str, port: int
) -> Optional[set[str]]:
  """The addresses the binary listens on once it listens; None if it ended
  first. Stops it and raises `_WorkerError` if it listens anywhere but
  `address`, or not within `_LISTEN_TIMEOUT_SECONDS`."""
  deadline = time.monotonic() + _LISTEN_TIMEOUT_SECONDS
  while process.poll() is None:
    listening = _listening_addresses(process.pid, port)
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
        env=environment, stdin=subprocess.DEVNULL,
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
