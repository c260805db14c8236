"""`python -m tff_fedrec.programs.worker` as a user starts it, and what a
training run says of a --workers address where no TFF worker answers.

Every worker here is a real process pair (the program and its
`worker_binary`); where it listens is read with `ss`, which knows nothing of
how the program got the address, and tried by connecting elsewhere on
loopback: all of 127.0.0.0/8 reaches a socket on every interface.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_fedrec.programs import execution


def _unused_port():
  with socket.socket() as sock:
    sock.bind(('127.0.0.1', 0))
    return sock.getsockname()[1]


def _listening_sockets(port):
  """[(local address, process column)] of the TCP sockets listening on
  `port`, as `ss -ltnp` shows them."""
  output = subprocess.run(
      ['ss', '-ltnpH', f'sport = :{port}'],
      capture_output=True, text=True, check=True,
  ).stdout
  return [(line.split()[3], line.split()[-1]) for line in output.splitlines()]


def _connects(host, port):
  try:
    with socket.create_connection((host, port), timeout=5):
      return True
  except ConnectionRefusedError:
    return False


class _WorkerProgram:
  """`python -m tff_fedrec.programs.worker ARGS`, its output in files."""

  def __init__(self, output_prefix, *args):
    self._stdout = output_prefix.with_suffix('.stdout')
    self._stderr = output_prefix.with_suffix('.stderr')
    with open(self._stdout, 'w') as out, open(self._stderr, 'w') as err:
      self.process = subprocess.Popen(
          [sys.executable, '-m', 'tff_fedrec.programs.worker', *args],
          stdin=subprocess.DEVNULL, stdout=out, stderr=err,
      )
    self.binary_pid = None

  @property
  def stdout(self):
    return self._stdout.read_text()

  @property
  def stderr(self):
    return self._stderr.read_text()

  def wait_until_listening(self, timeout_seconds=120):
    """The line saying where it listens; the binary's PID is kept."""
    deadline = time.monotonic() + timeout_seconds
    while 'listens on' not in self.stdout:
      assert self.process.poll() is None, (
          f'the worker exited with {self.process.returncode}:\n'
          f'{self.stderr[-3000:]}'
      )
      assert time.monotonic() < deadline, 'the worker did not listen'
      time.sleep(0.05)
    line = self.stdout.strip().splitlines()[-1]
    self.binary_pid = int(re.search(r'pid (\d+)', line).group(1))
    return line

  def stop(self):
    """SIGTERM, which the program passes on; then the binary must be gone
    (it is killed by its PID if not, and the test fails)."""
    if self.process.poll() is None:
      self.process.terminate()
      self.process.wait(timeout=60)
    if self.binary_pid is not None and _is_alive(self.binary_pid):
      os.kill(self.binary_pid, signal.SIGKILL)
      pytest.fail(f'worker_binary {self.binary_pid} outlived its program')


def _is_alive(pid):
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except FileNotFoundError:
    return False


@pytest.fixture
def start_worker(tmp_path):
  started = []

  def start(*args):
    program = _WorkerProgram(tmp_path / f'worker{len(started)}', *args)
    started.append(program)
    return program

  yield start
  for program in started:
    program.stop()


@tff.tensorflow.computation(np.float32)
def _add_one(x):
  return x + 1.0


def _computes(address):
  """Whether a TFF computation runs on the worker at `address`."""
  context = execution.make_remote_context(address, ready_timeout_seconds=30)
  with tff.framework.get_context_stack().install(context):
    return _add_one(np.float32(2.0)) == pytest.approx(3.0)


@pytest.mark.parametrize(
    'listen, address, elsewhere',
    [([], '127.0.0.1', '127.0.0.2'),
     (['--listen=127.0.0.2'], '127.0.0.2', '127.0.0.1')],
    ids=['default', 'listen'],
)
def test_the_worker_listens_on_loopback_or_where_listen_says(
    start_worker, listen, address, elsewhere
):
  port = _unused_port()
  worker = start_worker(f'--port={port}', *listen)
  line = worker.wait_until_listening()
  assert f'listens on {address}:{port}' in line
  assert 'only this machine can reach it' in line
  assert 'WARNING' not in line
  [(local_address, process)] = _listening_sockets(port)
  assert local_address == f'{address}:{port}'
  assert f'"worker_binary",pid={worker.binary_pid},' in process
  # A socket on every interface (the binary's own [::]) would take this.
  assert not _connects(elsewhere, port)
  assert _computes(f'{address}:{port}')


def test_off_loopback_the_worker_warns_that_anyone_can_run_code(start_worker):
  port = _unused_port()
  worker = start_worker(f'--port={port}', '--listen=0.0.0.0')
  line = worker.wait_until_listening()
  assert f'listens on 0.0.0.0:{port}' in line
  assert 'anyone who can reach 0.0.0.0' in line
  assert 'can run any code in it' in line
  assert [address for address, _ in _listening_sockets(port)] == [
      f'0.0.0.0:{port}'
  ]


def test_sigterm_ends_the_program_and_its_binary_alike(start_worker):
  worker = start_worker(f'--port={_unused_port()}')
  worker.wait_until_listening()
  worker.process.terminate()
  assert worker.process.wait(timeout=60) == -signal.SIGTERM
  deadline = time.monotonic() + 10
  while _is_alive(worker.binary_pid):
    assert time.monotonic() < deadline, 'worker_binary outlived its program'
    time.sleep(0.05)


def _held_by_a_socket(port):
  holder = socket.socket()
  holder.bind(('127.0.0.1', port))
  holder.listen()
  return holder.close


def _held_by_a_worker_binary(port):
  # worker_binary sets SO_REUSEPORT: a second one would start beside it.
  process, _ = execution.start_worker(port=port)
  deadline = time.monotonic() + 60
  while not _listening_sockets(port):
    assert time.monotonic() < deadline, 'worker_binary did not listen'
    time.sleep(0.05)
  return lambda: execution.stop_worker(process)


@pytest.mark.parametrize('hold', [_held_by_a_socket, _held_by_a_worker_binary],
                         ids=['socket', 'worker_binary'])
def test_a_taken_port_exits_non_zero_naming_the_port(hold):
  port = _unused_port()
  release = hold(port)
  try:
    holders = _listening_sockets(port)
    assert holders
    result = subprocess.run(
        [sys.executable, '-m', 'tff_fedrec.programs.worker', f'--port={port}'],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )
    assert _listening_sockets(port) == holders
  finally:
    release()
  assert result.returncode == 1, result.stderr[-3000:]
  assert f'port {port} is already in use' in result.stderr
  assert 'Pass another --port, or stop what holds it' in result.stderr
  assert 'listens on' not in result.stdout


def test_a_training_run_on_an_address_that_is_not_a_worker_fails_quickly(
    tmp_path
):
  port = _unused_port()
  web_server = subprocess.Popen(
      [sys.executable, '-m', 'http.server', '--bind', '127.0.0.1', str(port)],
      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL, cwd=tmp_path,
  )
  try:
    deadline = time.monotonic() + 30
    while not _connects('127.0.0.1', port):
      assert time.monotonic() < deadline, 'http.server did not listen'
      time.sleep(0.05)
    start = time.monotonic()
    # Before, the run waited --worker_timeout_seconds for an answer.
    result = subprocess.run(
        [sys.executable, '-m', 'tff_fedrec.programs.train',
         '--method=pfedrec', '--dataset=synthetic', '--synthetic_users=60',
         '--synthetic_items=600', '--embedding_dim=8', '--rounds=1',
         '--executor=remote', f'--workers=127.0.0.1:{port}',
         '--worker_timeout_seconds=120', f'--root_dir={tmp_path / "run"}'],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=100,
    )
    seconds = time.monotonic() - start
  finally:
    web_server.terminate()
    web_server.wait()
  assert result.returncode == 2, result.stderr[-3000:]
  assert (f'127.0.0.1:{port} answers, but it is not a TFF worker'
          in result.stderr)
  assert 'python -m tff_fedrec.programs.worker --port=' in result.stderr
  assert 'Traceback' not in result.stderr
  assert seconds < 60
