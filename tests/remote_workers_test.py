"""The training program on remote TFF workers (`--executor=remote`).

Two `worker_binary` processes on 127.0.0.1 stand in for executor machines;
the program connects to them through TFF's mergeable-computation context
exactly as it would to workers elsewhere. The run whose worker is killed
is a subprocess, as a user starts it; the others call
`training_program.main` in the test process, which saves a TensorFlow
import (about 10 s) each.
"""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tff_fedrec.programs import execution
from tff_fedrec.programs import program_test_utils
from tff_fedrec.programs import training_program

_summary = program_test_utils.read_summary

_PFEDREC = [
    '--method=pfedrec', '--dataset=synthetic', '--synthetic_users=60',
    '--synthetic_items=600', '--embedding_dim=8', '--item_learning_rate=50',
    '--users_per_tff_client=8',
]
_TIERED = [
    '--method=all_small', '--dataset=synthetic', '--synthetic_users=60',
    '--synthetic_items=200', '--clients_per_round=30', '--tier_widths=2,4,8',
    '--users_per_tff_client=8', '--eval_every=1',
]


def _command(args):
  return [sys.executable, '-m', 'tff_fedrec.programs.train', *args]


def _train(args):
  """Runs the training program in-process; returns its stdout."""
  return program_test_utils.run_main('train', training_program.main, args)


class _Workers:
  """Two local TFF workers that a test may kill and bring back."""

  def __init__(self):
    self.processes = []
    self.ports = []
    for _ in range(2):
      process, port = execution.start_worker()
      self.processes.append(process)
      self.ports.append(port)

  @property
  def flag(self):
    return '--workers=' + ','.join(f'127.0.0.1:{p}' for p in self.ports)

  def kill(self, index):
    os.kill(self.processes[index].pid, signal.SIGKILL)
    self.processes[index].wait()

  def restart(self, index):
    self.processes[index], _ = execution.start_worker(port=self.ports[index])

  def stop(self):
    for process in self.processes:
      execution.stop_worker(process)


@pytest.fixture
def workers():
  pool = _Workers()
  yield pool
  pool.stop()



def _assert_same_test_metrics(expected, actual):
  assert actual['rounds_completed'] == expected['rounds_completed']
  # Partial sums merged across workers may round differently in the last
  # float32 bit; anything a wrong client ordering or lost client would
  # cause is orders of magnitude larger.
  assert _leaves(actual['test']) == pytest.approx(
      _leaves(expected['test']), abs=1e-5
  )


def _leaves(tree, prefix=''):
  """{'a/b': number} of a nest of dicts."""
  if isinstance(tree, dict):
    return {
        key: value
        for name, child in tree.items()
        for key, value in _leaves(child, f'{prefix}{name}/').items()
    }
  return {prefix.rstrip('/'): tree}


@pytest.mark.parametrize('args', [_PFEDREC, _TIERED],
                         ids=['pfedrec', 'tiered'])
def test_two_remote_workers_give_the_results_of_the_local_run(
    tmp_path, workers, args
):
  local_dir, remote_dir = str(tmp_path / 'local'), str(tmp_path / 'remote')
  _train([*args, '--rounds=2', f'--root_dir={local_dir}'])
  remote = _train([*args, '--rounds=2', '--executor=remote', workers.flag,
                   f'--root_dir={remote_dir}'])
  assert 'TFF workers: 127.0.0.1:' in remote
  expected, actual = _summary(local_dir), _summary(remote_dir)
  _assert_same_test_metrics(expected, actual)
  assert actual['executor'] == {
      'kind': 'remote',
      'workers': [f'127.0.0.1:{p}' for p in workers.ports],
  }
  # Both workers did part of every round: each served computations.
  for process in workers.processes:
    assert process.poll() is None


def test_a_killed_worker_stops_the_run_clearly_and_the_run_resumes_later(
    tmp_path, workers
):
  args = [*_PFEDREC, '--rounds=5', '--executor=remote', workers.flag,
          '--worker_timeout_seconds=20']
  reference_dir = str(tmp_path / 'uninterrupted')
  _train([*_PFEDREC, '--rounds=5', f'--root_dir={reference_dir}'])

  root_dir = str(tmp_path / 'remote')
  process = subprocess.Popen(
      _command([*args, f'--root_dir={root_dir}']),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
  )
  checkpoint = os.path.join(root_dir, 'checkpoints', 'program_state_2')
  deadline = time.monotonic() + 240
  while not os.path.isdir(checkpoint) and process.poll() is None:
    assert time.monotonic() < deadline, 'no checkpoint 2'
    time.sleep(0.05)
  workers.kill(1)
  _, stderr = process.communicate(timeout=120)
  assert process.returncode == 3, stderr[-3000:]
  assert f'127.0.0.1:{workers.ports[1]} stopped answering' in stderr
  assert 'start the worker again' in stderr
  assert 'Traceback' not in stderr
  assert not os.path.exists(os.path.join(root_dir, 'summary.json'))

  workers.restart(1)
  resumed = _train([*args, f'--root_dir={root_dir}'])
  assert 'Resumed from checkpoint' in resumed
  _assert_same_test_metrics(_summary(reference_dir), _summary(root_dir))


def _unused_port():
  with socket.socket() as sock:
    sock.bind(('127.0.0.1', 0))
    return sock.getsockname()[1]


@pytest.mark.parametrize(
    'flags, message',
    [
        (['--executor=remote', '--workers=10.1.2.3:8000'],
         '--allow_insecure_remote'),
        (['--executor=remote', f'--workers=127.0.0.1:{_unused_port()}',
          '--worker_timeout_seconds=1'], 'Nothing listens at 127.0.0.1:'),
    ],
    ids=['not-loopback', 'nobody-answers'],
)
def test_bad_worker_flags_fail_with_a_message_naming_the_problem(
    tmp_path, flags, message
):
  # The other refused worker flags are tested through main() in
  # programs/training_program_test.py.
  status, stderr = program_test_utils.exit_status_and_stderr(
      'train', training_program.main,
      [*_PFEDREC, '--rounds=1', *flags, f'--root_dir={tmp_path / "run"}'],
  )
  assert status == 2
  assert message in stderr
