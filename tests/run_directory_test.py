"""A run directory has one owner and one data set, and the program deletes
only what it wrote: through the real `train` and `export` entry points.

Each refusal must exit non-zero without a traceback, name the problem and
the way out, and leave the directory byte for byte as it was (or, for a
run another process holds, leave that run resumable).
"""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tff_fedrec.programs import export_program
from tff_fedrec.programs import program_test_utils
from tff_fedrec.programs import run_directory
from tff_fedrec.programs import training_program

_SYNTHETIC = ['--dataset=synthetic', '--synthetic_users=30',
              '--synthetic_items=400', '--num_eval_negatives=20',
              '--embedding_dim=8', '--item_learning_rate=50']
_RUN = ['--method=pfedrec', *_SYNTHETIC, '--rounds=2']


_snapshot = program_test_utils.snapshot


def _refused(program, args, *messages):
  main = training_program.main if program == 'train' else export_program.main
  return program_test_utils.refused(program, main, args, *messages)


def _train(args):
  return program_test_utils.run_main('train', training_program.main, args)


def _rounds_in_metrics(root_dir):
  return [int(row['round'])
          for row in program_test_utils.read_metrics(root_dir)]


@pytest.fixture(scope='module')
def finished_run(tmp_path_factory):
  """A finished 2-round PFedRec run; tests copy it before changing it."""
  root_dir = str(tmp_path_factory.mktemp('finished') / 'run')
  _train([*_RUN, f'--root_dir={root_dir}'])
  return root_dir


def _copy(finished_run, tmp_path, name='run'):
  root_dir = str(tmp_path / name)
  shutil.copytree(finished_run, root_dir)
  return root_dir


def test_a_second_start_is_refused_naming_the_owner_and_a_kill_leaves_no_lock(
    tmp_path
):
  root_dir = str(tmp_path / 'run')
  first = subprocess.Popen(
      [sys.executable, '-m', 'tff_fedrec.programs.train', *_RUN[:-1],
       '--rounds=100000', f'--root_dir={root_dir}'],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.monotonic() + 300
    while not run_directory.has_checkpoint(root_dir):
      assert first.poll() is None, first.communicate()[1]
      assert time.monotonic() < deadline, 'no checkpoint after 300 s'
      time.sleep(0.2)
    with open(os.path.join(root_dir, 'run.flags'), 'rb') as f:
      flags_before = f.read()
    # Other settings (the case that mixed two runs) and the same ones.
    for extra in (['--seed=1'], []):
      _refused('train', [*_RUN[:-1], '--rounds=100000', *extra,
                         f'--root_dir={root_dir}'],
               f'--root_dir={root_dir} is in use by process {first.pid}',
               'another --root_dir', 'Nothing was written')
    with open(os.path.join(root_dir, 'run.flags'), 'rb') as f:
      assert f.read() == flags_before
  finally:
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=60)
  # The kernel released the lock with the process: the same command
  # resumes (to a few rounds past its last checkpoint), one row per round.
  last = max(int(name.rpartition('_')[2]) for name in os.listdir(
      os.path.join(root_dir, 'checkpoints')) if name[-1].isdigit())
  stdout = _train([*_RUN[:-1], f'--rounds={last + 2}',
                   f'--root_dir={root_dir}'])
  assert f'Resumed from checkpoint {last}' in stdout
  assert _rounds_in_metrics(root_dir) == list(range(last + 2))
  assert not os.path.exists(os.path.join(root_dir, 'run.lock'))


def test_a_new_run_in_a_folder_of_other_files_is_refused_naming_them(
    tmp_path
):
  # The case that failed with CSVKeyFieldnameNotFoundError.
  root_dir = tmp_path / 'run'
  (root_dir / 'tensorboard').mkdir(parents=True)
  (root_dir / 'tensorboard' / 'events.out.tfevents.1.other').write_bytes(b'x')
  (root_dir / 'metrics.csv').write_text('step,loss\n1,0.5\n')
  (root_dir / 'summary.json').write_text('{"accuracy": 0.9}')
  before = _snapshot(root_dir)
  _refused('train', [*_RUN, f'--root_dir={root_dir}'],
           'holds metrics.csv, summary.json, tensorboard',
           'did not write', 'a new run starts in an empty or missing folder',
           'Nothing was written')
  assert _snapshot(root_dir) == before


@pytest.mark.parametrize('foreign, named', [
    ({'notes.txt': b'my notes'}, 'notes.txt'),
    ({'tensorboard/my_plot.png': b'\x89PNG'}, 'tensorboard'),
    ({'summary.json': b'{"from": "another tool"}'}, 'summary.json'),
    ({'metrics.csv': b'epoch,auc\n1,0.7\n'}, 'metrics.csv'),
], ids=['a-file', 'in-tensorboard', 'a-summary', 'a-metrics-file'])
def test_a_restart_without_checkpoint_removes_only_its_own_files(
    tmp_path, finished_run, foreign, named
):
  # A first attempt that saved no round (as one that diverged): its
  # run.flags and releases stay, its checkpoints never came.
  root_dir = _copy(finished_run, tmp_path)
  shutil.rmtree(os.path.join(root_dir, 'checkpoints'))
  for relative, content in foreign.items():
    path = os.path.join(root_dir, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'wb') as f:
      f.write(content)
  before = _snapshot(root_dir)
  _refused('train', [*_RUN, f'--root_dir={root_dir}'],
           f'holds {named}', 'did not write',
           'removes what the run released', 'Nothing was written')
  assert _snapshot(root_dir) == before
  # Without them the start begins the run again, removing its own files.
  for relative in foreign:
    os.remove(os.path.join(root_dir, relative))
  shutil.copy(os.path.join(finished_run, 'summary.json'), root_dir)
  shutil.copy(os.path.join(finished_run, 'metrics.csv'), root_dir)
  stdout = _train([*_RUN, f'--root_dir={root_dir}'])
  assert 'Resumed' not in stdout
  assert _rounds_in_metrics(root_dir) == [0, 1]
  assert len(os.listdir(os.path.join(root_dir, 'tensorboard'))) == 1


def test_a_resume_does_not_append_to_a_metrics_file_it_did_not_write(
    tmp_path, finished_run
):
  root_dir = _copy(finished_run, tmp_path)
  with open(os.path.join(root_dir, 'metrics.csv'), 'w') as f:
    f.write('epoch,auc\n1,0.7\n')
  with open(os.path.join(root_dir, 'my_notes.txt'), 'w') as f:
    f.write('kept')  # Beside a resumed run, a file of one's own may stay.
  before = _snapshot(root_dir)
  _refused('train', [*_RUN[:-1], '--rounds=3', f'--root_dir={root_dir}'],
           'holds metrics.csv', 'appends to its metrics.csv')
  assert _snapshot(root_dir) == before


def test_checkpoints_without_run_flags_are_refused(tmp_path, finished_run):
  root_dir = _copy(finished_run, tmp_path)
  os.remove(os.path.join(root_dir, 'run.flags'))
  before = _snapshot(root_dir)
  # With other settings too: it was taken as "Resumed from checkpoint".
  for args in (_RUN, [*_RUN, '--seed=7', '--num_negatives=1']):
    _refused('train', [*args, f'--root_dir={root_dir}'],
             'holds checkpoints but no run.flags',
             f'Restore {root_dir}/run.flags', 'new --root_dir',
             'Nothing was written')
  assert _snapshot(root_dir) == before


def _interactions(users, per_user, extra=()):
  lines = [f'u{u},i{(u * 7 + k * 3) % 60},1,{u * 100 + k}'
           for u in range(users) for k in range(per_user)]
  return ('\n'.join([*lines, *extra]) + '\n').encode()


@pytest.mark.parametrize('appended', [
    'u0,i59,1,99999',  # a row of a known user
    'u_new,i1,1,99999',  # a new user ("client states do not match")
], ids=['a-row', 'a-new-user'])
def test_a_changed_data_file_is_refused_naming_it(tmp_path, appended):
  data_path = tmp_path / 'ratings.csv'
  data_path.write_bytes(_interactions(20, 8))
  root_dir = str(tmp_path / 'run')
  args = ['--method=pfedrec', f'--data_path={data_path}',
          '--num_eval_negatives=10', '--embedding_dim=8',
          f'--root_dir={root_dir}']
  _train([*args, '--rounds=2'])
  original = data_path.read_bytes()
  data_path.write_bytes(original + f'{appended}\n'.encode())
  before = _snapshot(root_dir)
  for program, extra in (('train', ['--rounds=3']), ('export', [])):
    program_args = (args + extra if program == 'train'
                    else [f'--root_dir={root_dir}'])
    _refused(program, program_args,
             f'The data of the run in {root_dir} has changed',
             f'{data_path} now gives 161 interactions',
             'the run trained on 160 interactions', 'restore that file',
             'new --root_dir')
  assert _snapshot(root_dir) == before
  data_path.write_bytes(original)
  assert 'Resumed from checkpoint 2' in _train([*args, '--rounds=3'])


def test_a_run_an_older_version_started_records_its_data_on_resume(
    tmp_path, finished_run
):
  root_dir = _copy(finished_run, tmp_path)
  os.remove(os.path.join(root_dir, 'run.data.json'))
  assert 'Resumed from checkpoint 2' in _train(
      [*_RUN[:-1], '--rounds=3', f'--root_dir={root_dir}'])
  assert run_directory.saved_data(root_dir) == run_directory.saved_data(
      finished_run)


def test_a_flag_before_the_flagfile_overrides_the_preset_and_files_follow_umask(
    tmp_path
):
  preset = tmp_path / 'preset.flags'
  preset.write_text('\n'.join([*_RUN, '--seed=0', '--num_negatives=4']) + '\n')
  root_dir = str(tmp_path / 'run')
  command = [sys.executable, '-m', 'tff_fedrec.programs.train', '--seed=3',
             f'--flagfile={preset}', '--num_negatives=2', '--rounds=1',
             f'--root_dir={root_dir}']
  # The umask set by the child's shell: a preexec_fn would fork this
  # process and its gRPC threads.
  result = subprocess.run(
      ['sh', '-c', 'umask 027 && exec "$@"', 'sh', *command],
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  flags = open(os.path.join(root_dir, 'run.flags')).read().splitlines()
  assert '--seed=3' in flags  # given before --flagfile
  assert '--num_negatives=2' in flags  # given after it
  assert '--synthetic_users=30' in flags  # the preset's
  for name in ('run.flags', 'run.data.json', 'summary.json', 'metrics.csv',
               'peak_rss_mb.txt'):
    mode = os.stat(os.path.join(root_dir, name)).st_mode & 0o777
    assert mode == 0o640, (name, oct(mode))


def test_flagfiles_first_keeps_every_argument_and_their_order():
  assert training_program.flagfiles_first(
      ['train', '--seed=3', '--flagfile=a', '--rounds=2', '--flagfile', 'b',
       '--', '--flagfile=c']
  ) == ['train', '--flagfile=a', '--flagfile', 'b', '--seed=3', '--rounds=2',
        '--', '--flagfile=c']
