"""`import tff_fedrec` ends TFF's default-context worker when Python exits."""

import os
import signal
import subprocess
import sys
import time

import pytest

import tff_fedrec
from tff_fedrec import worker_processes

# Runs a computation in TFF's default context, which starts `worker_binary`
# as a child, and prints the children's PIDs before exiting normally.
_PROGRAM = r'''
import glob
import numpy as np
import tensorflow_federated as tff
import tff_fedrec

@tff.tensorflow.computation(np.int32)
def add_one(x):
  return x + 1

assert add_one(1) == 2
children = []
for path in glob.glob('/proc/self/task/*/children'):
  with open(path) as f:
    children += f.read().split()
print('children', *children)
'''


# Prepended to `_PROGRAM`: the program ignores SIGINT before TFF starts the
# worker, which inherits SIG_IGN. Set in the program, not by a `preexec_fn`:
# that makes Popen fork this process, whose gRPC threads (earlier tests') can
# abort the forked child ("ev_epoll1_linux.cc Check failed").
_IGNORE_SIGINT = 'import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n'


@pytest.mark.parametrize(
    'prelude', ['', _IGNORE_SIGINT], ids=['sigint_default', 'sigint_ignored']
)
def test_the_default_context_worker_stops_with_the_program(tmp_path, prelude):
  # With SIGINT ignored (as for a job started with `&` from a script), the
  # worker inherits SIG_IGN and TFF's own stop, SIGINT and an unbounded
  # wait, hangs the exit: seen once here, a 300 s timeout.
  # Files, not pipes: a worker left running would hold a pipe open and
  # keep the wait going. A session of its own, so a hung program is killed
  # together with its worker.
  with open(tmp_path / 'out', 'w') as out, open(tmp_path / 'err', 'w') as err:
    process = subprocess.Popen(
        [sys.executable, '-c', prelude + _PROGRAM], stdout=out, stderr=err,
        # The checkout this test imports, whatever the caller's directory.
        cwd=os.path.dirname(os.path.dirname(tff_fedrec.__file__)),
        start_new_session=True,
    )
    try:
      status = process.wait(timeout=180)
    except subprocess.TimeoutExpired:
      os.killpg(process.pid, signal.SIGKILL)
      process.wait()
      raise AssertionError('the program did not exit within 180 s')
  stdout, stderr = ((tmp_path / name).read_text() for name in ('out', 'err'))
  assert status == 0, stderr[-3000:]
  line = next(l for l in stdout.splitlines() if l.startswith('children'))
  workers = line.split()[1:]
  assert workers, 'the default context started no worker to check'
  time.sleep(1.0)
  left_running = [
      pid for pid in workers if worker_processes.is_running_worker(pid)
  ]
  for pid in left_running:  # Do not leak them when the test fails.
    os.kill(int(pid), signal.SIGKILL)
  assert not left_running
  assert 'Exception ignored' not in stderr
