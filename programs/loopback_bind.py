"""Makes TFF's `worker_binary` listen on one address instead of every one.

TFF 0.87's binary has no flag for an address: it always binds `[::]:PORT`,
every interface (`servers.cc`), an unauthenticated service that runs any
computation sent to it. `redirected_environment(address, port)` is the
environment to start it in: a one-function library preloaded (`_BIND_SHIM_C`,
compiled once per process with the machine's C compiler into a private
temporary folder, removed at exit) whose `bind()` puts `address` in place of
that wildcard on `port`. For an IPv4 address it fails the IPv6 wildcard bind,
and gRPC falls back to an IPv4 socket, which gets the address. It also drops
the binary's SO_REUSEPORT there, so no second worker can share the port.
`listening_addresses(pid, port)` reads, from /proc, where a process really
listens, so that a caller can check.

Used by the worker program (`programs/worker.py`, `--listen`) and by the
worker every local run starts (`execution.start_worker`, on 127.0.0.1).

Example:
  >>> with redirected_environment('127.0.0.1', 8000) as environment:
  ...   subprocess.Popen([worker_binary, '--port=8000'], env=environment)
"""

import atexit
import contextlib
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from typing import Iterator


class BindRedirectError(Exception):
  """The library cannot be built; the message says why."""


ADDRESS_VARIABLE = 'TFF_FEDREC_LISTEN_ADDRESS'
PORT_VARIABLE = 'TFF_FEDREC_LISTEN_PORT'

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
""" % {'address': ADDRESS_VARIABLE, 'port': PORT_VARIABLE}

_library = None


def _compiled_library() -> str:
  """The path of the library, compiled on first use (BindRedirectError
  without a C compiler, or if it does not compile)."""
  global _library
  if _library is not None:
    return _library
  compiler = shlex.split(os.environ.get('CC', '')) or [
      shutil.which('cc') or shutil.which('gcc') or 'cc']
  if not shutil.which(compiler[0]):
    raise BindRedirectError(f'no C compiler ({compiler[0]}) is installed')
  folder = tempfile.mkdtemp(prefix='tff_fedrec_bind_')
  atexit.register(shutil.rmtree, folder, ignore_errors=True)
  library = os.path.join(folder, 'bind_shim.so')
  compiled = subprocess.run(
      [*compiler, '-shared', '-fPIC', '-O2', '-o', library, '-x', 'c', '-',
       '-ldl'],
      input=_BIND_SHIM_C, capture_output=True, text=True, check=False,
  )
  if compiled.returncode != 0:
    raise BindRedirectError(
        f'{shlex.join(compiler)} could not compile it '
        f'({compiled.stderr.strip()})')
  _library = library
  return library


@contextlib.contextmanager
def redirected_environment(address: str, port: int) -> Iterator[dict]:
  """This process's environment with the library preloaded for
  `address`:`port`; `::` is the binary's own bind: no library."""
  environment = dict(os.environ)
  if address != '::':
    library = _compiled_library()
    preload = os.environ.get('LD_PRELOAD')
    environment['LD_PRELOAD'] = f'{library} {preload}' if preload else library
    environment[ADDRESS_VARIABLE] = address
    environment[PORT_VARIABLE] = str(port)
  yield environment


def _decode_proc_address(hex_address: str, family: socket.AddressFamily) -> str:
  # /proc/net/tcp* writes each 32-bit word of the address in host byte order.
  words = [bytes.fromhex(hex_address[i:i + 8])
           for i in range(0, len(hex_address), 8)]
  if sys.byteorder == 'little':
    words = [word[::-1] for word in words]
  return socket.inet_ntop(family, b''.join(words))


def listening_addresses(pid: int, port: int) -> set[str]:
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


