"""The bind redirection on a real socket, and /proc's listening sockets."""

import os
import socket
import subprocess
import sys

import pytest

from tff_fedrec.programs import loopback_bind

# A process that binds the IPv4 wildcard on a port and reports where it
# listens, as worker_binary's gRPC server falls back to doing.
_LISTEN_ON_WILDCARD = (
    'import socket, sys\n'
    's = socket.socket(); s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen()\n'
    'print(s.getsockname()[0], flush=True); sys.stdin.read()\n'
)


def _free_port():
  with socket.socket() as probe:
    probe.bind(('127.0.0.1', 0))
    return probe.getsockname()[1]


@pytest.mark.parametrize('redirect', [True, False])
def test_the_wildcard_bind_on_the_port_becomes_the_address(redirect):
  port = _free_port()
  environment = dict(os.environ)
  if redirect:
    with loopback_bind.redirected_environment('127.0.0.1', port) as env:
      environment = env
  process = subprocess.Popen(
      [sys.executable, '-c', _LISTEN_ON_WILDCARD, str(port)],
      env=environment, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
      text=True)
  try:
    bound = process.stdout.readline().strip()
    listening = loopback_bind.listening_addresses(process.pid, port)
  finally:
    process.kill()
    process.wait()
  expected = '127.0.0.1' if redirect else '0.0.0.0'
  assert bound == expected
  assert listening == {expected}


def test_every_interface_needs_no_library():
  with loopback_bind.redirected_environment('::', 8000) as environment:
    assert loopback_bind.ADDRESS_VARIABLE not in environment
    assert environment.get('LD_PRELOAD') == os.environ.get('LD_PRELOAD')
