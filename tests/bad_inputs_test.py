"""Bad input through the real entry points: files, flags, run directories,
checkpoints, export and workers.

Every case must exit with a non-zero status, print no traceback, name the
file or flag at fault and the fix, and leave the run directory as it was,
byte for byte (a refused start writes nothing). The programs' `main` runs
in the test process (`program_test_utils`); Ctrl-C goes through the binary.
"""

import gzip
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

_SHARES_FINISHED_RUN = pytest.mark.xdist_group('bad_inputs_finished_run')

# argv: MODULE ARGS...; runs MODULE as `python -m MODULE ARGS...` would, with
# SIGINT raising KeyboardInterrupt whatever disposition was inherited.
_RUN_MODULE_WITH_SIGINT_HANDLED = (
    'import runpy, signal, sys\n'
    'signal.signal(signal.SIGINT, signal.default_int_handler)\n'
    'module = sys.argv.pop(1)\n'
    'runpy.run_module(module, run_name="__main__", alter_sys=True)\n'
)


_snapshot = program_test_utils.snapshot


def _refused(program, args, *messages):
  main = training_program.main if program == 'train' else export_program.main
  return program_test_utils.refused(program, main, args, *messages)


@pytest.fixture(scope='module')
def finished_run(tmp_path_factory):
  """A finished 2-round PFedRec run, never changed by the tests (each
  copies it or checks it is unchanged)."""
  root_dir = str(tmp_path_factory.mktemp('finished') / 'run')
  program_test_utils.run_main(
      'train', training_program.main, [*_RUN, f'--root_dir={root_dir}'])
  return root_dir


def _write(tmp_path, name, content: bytes):
  path = tmp_path / name
  path.write_bytes(content)
  return str(path)


_GOOD_LINES = b''.join(
    f'u{u},i{i},1,{t}\n'.encode()
    for t, (u, i) in enumerate((u, (u * 7 + k) % 40)
                               for u in range(4) for k in range(6)))


@pytest.mark.parametrize('content, extra, messages', [
    (None, [], ['no such file', '--data_path']),
    (b'', [], ['the file is empty', '--data_path']),
    (b'\xff\xfeu,i,1,1\n', [], ['not valid UTF-8', 'UTF-16', 'iconv']),
    (gzip.compress(_GOOD_LINES), [], ['gzip-compressed', 'gunzip']),
    (b'u1,i1,x,1\n' + _GOOD_LINES, [], [":1: the rating 'x'",
                                        '--header=true']),
    (b'u1,i1,1\n', [], [':1:', '--separator']),
    (b'user,item,rating,timestamp\nu1,i1,x,1\n', ['--header=false'],
     [':1:', '--header=true']),
    (b'u1,i1,1,1\nu1,i2,1,2\nu2,i1,1,3\n', [],
     ["user 'u1' has 2", '--min_interactions=3']),
    (_GOOD_LINES, ['--min_interactions=100'],
     ['--min_interactions=100 drops every user']),
    (_GOOD_LINES, ['--num_eval_negatives=99'], ['--num_eval_negatives']),
], ids=['missing', 'empty', 'not-utf8', 'gzip', 'header-auto-data-row',
        'fields', 'header', 'few-interactions',
        'drops-everyone', 'eval-negatives'])
def test_bad_data_files_name_the_file_and_the_fix(
    tmp_path, content, extra, messages
):
  path = (str(tmp_path / 'absent.csv') if content is None
          else _write(tmp_path, 'ratings.csv', content))
  root_dir = tmp_path / 'run'
  stderr = _refused('train', ['--method=pfedrec', f'--data_path={path}',
                              *extra, f'--root_dir={root_dir}'], *messages)
  assert path in stderr
  assert not root_dir.exists()


def test_a_folder_as_data_file_is_named(tmp_path):
  _refused('train', ['--method=pfedrec', f'--data_path={tmp_path}',
                     f'--root_dir={tmp_path / "run"}'],
           str(tmp_path), 'is a directory')


@pytest.mark.parametrize('args, message', [
    ([], '--method is required'),
    (['--method=pfedrec'], '--root_dir is required'),
    (['--method=pfedrec', '--root_dir=R'], 'Give --dataset'),
    (['--method=pfedrec', '--dataset=synthetic', '--data_path=x.csv',
      '--root_dir=R'], 'cannot be combined'),
    ([*_RUN, '--separator=', '--root_dir=R'], '--separator must not be empty'),
    ([*_RUN, '--rounds=0', '--root_dir=R'], '--rounds must be at least 1'),
    ([*_RUN, '--checkpoint_every=0', '--root_dir=R'],
     '--checkpoint_every must be at least 1'),
    ([*_RUN, '--eval_every=0', '--root_dir=R'],
     '--eval_every must be at least 1'),
    ([*_RUN, '--num_negatives=-1', '--root_dir=R'],
     '--num_negatives must be at least 1'),
    ([*_RUN, '--users_per_tff_client=0', '--root_dir=R'],
     '--users_per_tff_client must be at least 1'),
    ([*_RUN, '--device_tiers=dirichlet:0', '--root_dir=R'],
     "--device_tiers: 'dirichlet:0' is not a device tier mapping"),
    ([*_RUN, '--device_tiers=random', '--root_dir=R'],
     'give round_robin or dirichlet:ALPHA'),
    ([*_RUN, '--device_tiers=round_robin', '--tier_ratio=1,1,1',
      '--root_dir=R'], 'Give --device_tiers or --tier_ratio, not both'),
    ([*_RUN, '--cohort_state_mb=-1', '--root_dir=R'],
     '--cohort_state_mb must be a number of MiB from 0'),
    ([*_RUN, '--cohort_state_mb=nan', '--root_dir=R'],
     '--cohort_state_mb must be a number of MiB from 0'),
    ([*_RUN, '--clients_per_round=0', '--root_dir=R'],
     '--clients_per_round must be at least 1'),
    ([*_RUN, '--client_fraction=1.5', '--root_dir=R'],
     '--client_fraction must be in (0, 1]'),
    ([*_RUN, '--clients_per_round=1000', '--root_dir=R'],
     '--clients_per_round must be in [1, 30]'),
    ([*_RUN, '--learning_rate=nan', '--root_dir=R'],
     '--learning_rate must be a finite number above 0'),
    ([*_RUN, '--learning_rate=-0.1', '--root_dir=R'],
     '--learning_rate must be a finite number above 0'),
    ([*_RUN, '--item_learning_rate=inf', '--root_dir=R'],
     '--item_learning_rate must be a finite number above 0'),
    ([*_RUN, '--hidden_units=abc', '--root_dir=R'],
     '--hidden_units takes comma-separated positive integers'),
    ([*_RUN, '--embedding_dim=0', '--root_dir=R'],
     '--embedding_dim must be at least 1'),
    ([*_RUN, '--ldp_noise_scale=-1', '--root_dir=R'],
     'LDP never fails open: --ldp_noise_scale must be'),
    ([*_RUN, '--ldp_noise_scale=nan', '--root_dir=R'],
     'LDP never fails open: --ldp_noise_scale must be'),
    ([*_RUN, '--update_rule=local_adam', '--root_dir=R'],
     '--update_rule does not apply to --method=pfedrec'),
    ([*_RUN, '--exchange=topk', '--alpha=0.3', '--root_dir=R'],
     '--alpha applies to fedras only'),
    ([*_RUN, '--compression_rate=0.5', '--root_dir=R'],
     '--compression_rate needs a compressed exchange'),
    ([*_RUN, '--exchange=fedras', '--compression_rate=1', '--root_dir=R'],
     '--compression_rate must be in [0, 1)'),
    ([*_RUN, '--exchange=fedras', '--alpha=nan', '--root_dir=R'],
     '--alpha must be a finite number'),
    ([*_RUN, '--exchange=fedras', '--tier_compression_rates=0.9,x,0.2',
      '--root_dir=R'], '--tier_compression_rates takes 3'),
    (['--method=hetefedrec', *_SYNTHETIC[:2], '--local_epochs=5',
      '--root_dir=R'], '--local_epochs does not apply to --method=hetefedrec'),
    (['--method=hetefedrec', *_SYNTHETIC[:2], '--tier_widths=8,4,2',
      '--root_dir=R'], '--tier_widths needs 3 positive, non-decreasing'),
    (['--method=hetefedrec', *_SYNTHETIC[:2], '--tier_ratio=1,1',
      '--root_dir=R'], '--tier_ratio needs 3 values'),
    (['--method=hetefedrec', *_SYNTHETIC[:2], '--decorrelation_weight=-1',
      '--root_dir=R'], '--decorrelation_weight must be >= 0'),
    (['--method=hetefedrec', *_SYNTHETIC[:2], '--embedding_dim=16',
      '--root_dir=R'], '--embedding_dim does not apply to --method=hetefedrec'),
    (['--method=fedras', *_SYNTHETIC, '--exchange=topk', '--root_dir=R'],
     '--exchange does not apply to --method=fedras'),
    (['--method=hetefedrec', *_SYNTHETIC[:2],
      '--negative_pool=outside_training', '--root_dir=R'],
     '--negative_pool does not apply to --method=hetefedrec'),
    ([*_RUN, '--seed=-1', '--root_dir=R'],
     '--seed=-1 is out of range: give an integer from 0 to 4294967295'),
    ([*_RUN, f'--seed={2**64}', '--root_dir=R'], f'--seed={2**64} is out'),
    # Huge counts overflowed (OverflowError, a TypeError in a tf.function)
    # or exhausted memory with numpy's own words.
    ([*_RUN, f'--num_negatives={2**64}', '--root_dir=R'],
     f'--num_negatives={2**64} is too large: at most 2,147,483,647'),
    ([*_RUN, '--num_negatives=100000', '--root_dir=R'],
     '--num_negatives=100000 is too large: at most 1,000'),
    ([*_RUN, f'--local_epochs={2**64}', '--root_dir=R'],
     f'--local_epochs={2**64} is too large'),
    ([*_RUN, '--embedding_dim=1000000', '--root_dir=R'],
     '--embedding_dim=1000000 is too large: at most 4,096'),
    ([*_RUN, '--hidden_units=8,1000000', '--root_dir=R'],
     '--hidden_units=8,1000000 is too large'),
    ([*_RUN, '--synthetic_users=1000000000', '--root_dir=R'],
     '--synthetic_users=1000000000 is too large: at most 100,000,000'),
    ([*_RUN, '--data_path=x.csv', '--dataset=ml-100k', '--separator=\\x',
      '--root_dir=R'],
     "--separator='\\x' is not a valid escape"),
    ([*_RUN, '--executor=remote', '--root_dir=R'], '--workers=HOST:PORT'),
    ([*_RUN, '--workers=127.0.0.1:1', '--root_dir=R'], '--executor=remote'),
    ([*_RUN, '--executor=remote', '--workers=10.1.2.3:80', '--root_dir=R'],
     '--allow_insecure_remote'),
    ([*_RUN, '--executor=remote', '--workers=127.0.0.1:1',
      '--worker_timeout_seconds=-1', '--root_dir=R'],
     '--worker_timeout_seconds must be a finite number above 0'),
], ids=lambda value: ' '.join(value) if isinstance(value, list) else None)
def test_bad_flags_are_named_before_any_data_loads(
    tmp_path, monkeypatch, args, message
):
  monkeypatch.chdir(tmp_path)  # 'R': a root directory nobody makes.
  _refused('train', args, message)
  assert not (tmp_path / 'R').exists()


def test_a_root_dir_that_is_a_file_or_under_one_is_refused(tmp_path):
  path = _write(tmp_path, 'file', b'not a folder')
  _refused('train', [*_RUN, f'--root_dir={path}'], f'--root_dir={path}',
           'is a file')
  _refused('train', [*_RUN, f'--root_dir={path}/run'], 'cannot be made')
  with open(path, 'rb') as f:
    assert f.read() == b'not a folder'


@_SHARES_FINISHED_RUN
@pytest.mark.parametrize('args, messages', [
    (['--method=fedmf', *_SYNTHETIC, '--rounds=2'],
     ['--method=pfedrec (the run) but --method=fedmf (now)']),
    ([*_RUN, '--learning_rate=0.5', '--seed=7'],
     ['--learning_rate unset (the run) but --learning_rate=0.5 (now)',
      '--seed=0 (the run) but --seed=7 (now)']),
    (['--method=pfedrec', '--dataset=ml-100k', '--rounds=2'],
     ['--dataset=synthetic (the run) but --dataset=ml-100k (now)']),
    ([*_RUN[:-1], '--synthetic_users=31', '--rounds=2'],
     ['--synthetic_users=30 (the run)']),
], ids=['method', 'settings', 'data', 'data-size'])
def test_a_finished_run_refuses_other_settings_and_stays_as_it_was(
    finished_run, args, messages
):
  before = _snapshot(finished_run)
  stderr = _refused('train', [*args, f'--root_dir={finished_run}'],
                    *messages, 'Nothing was written')
  assert 'only --allow_insecure_remote' in stderr  # What may change.
  assert _snapshot(finished_run) == before


@_SHARES_FINISHED_RUN
def test_a_run_with_every_checkpoint_damaged_names_them_and_the_way_out(
    tmp_path, finished_run
):
  root_dir = str(tmp_path / 'run')
  shutil.copytree(finished_run, root_dir)
  checkpoints = os.path.join(root_dir, 'checkpoints')
  for version in os.listdir(checkpoints):
    with open(os.path.join(checkpoints, version, '0.npy'), 'wb'):
      pass  # Emptied.
  before = _snapshot(root_dir)
  _refused('train', [*_RUN[:-1], '--rounds=3', f'--root_dir={root_dir}'],
           '0.npy cannot be read', f'Delete {checkpoints}', 'new --root_dir')
  assert _snapshot(root_dir) == before


@_SHARES_FINISHED_RUN
@pytest.mark.parametrize('args, messages', [
    (['--learning_rate=0.5'], ['--learning_rate is a training flag',
                               'only --data_path and --cache_dir']),
    (['--quantizations=int4'], ['Unknown quantization int4']),
    (['--users=nobody'], ['Unknown user id(s) nobody']),
    (['--tiers=large'], ["trains no 'large' model"]),
], ids=['training-flag', 'quantization', 'user', 'tier'])
def test_export_refusals_leave_the_run_as_it_was(finished_run, args, messages):
  before = _snapshot(finished_run)
  _refused('export', [f'--root_dir={finished_run}', *args], *messages)
  assert _snapshot(finished_run) == before


@_SHARES_FINISHED_RUN
def test_export_to_a_file_or_from_a_folder_without_a_run(
    tmp_path, finished_run
):
  path = _write(tmp_path, 'out', b'x')
  before = _snapshot(finished_run)
  _refused('export', [f'--root_dir={finished_run}', f'--output_dir={path}'],
           f'--output_dir={path} is a file')
  assert _snapshot(finished_run) == before
  _refused('export', [f'--root_dir={tmp_path}'],
           'is not a training run directory', 'run.flags')


@_SHARES_FINISHED_RUN
def test_a_damaged_latest_checkpoint_is_passed_over_and_the_run_resumes(
    tmp_path, finished_run
):
  root_dir = str(tmp_path / 'run')
  shutil.copytree(finished_run, root_dir)
  latest = os.path.join(root_dir, 'checkpoints', 'program_state_2')
  with open(os.path.join(latest, '1.npy'), 'r+b') as f:
    f.truncate(10)
  stdout = program_test_utils.run_main(
      'train', training_program.main,
      [*_RUN[:-1], '--rounds=3', f'--root_dir={root_dir}'])
  assert 'program_state_2/1.npy cannot be read' in stdout
  assert 'Passed over for the checkpoint before it' in stdout
  assert 'Resumed from checkpoint 1: 1 of 3 rounds done.' in stdout


def test_ctrl_c_says_the_run_can_be_resumed(tmp_path):
  root_dir = str(tmp_path / 'run')
  # SIGINT handled as in a program started from a terminal, also where the
  # test run was started with SIGINT ignored (in the background from a
  # script), which the program would inherit and keep. Set by the child
  # interpreter, not by a `preexec_fn`: that makes Popen fork this process,
  # whose gRPC threads (earlier tests') have aborted the forked child
  # ("ev_epoll1_linux.cc Check failed: next_worker->state == KICKED", code -6).
  process = subprocess.Popen(
      [sys.executable, '-c', _RUN_MODULE_WITH_SIGINT_HANDLED,
       'tff_fedrec.programs.train', *_RUN[:-1], '--rounds=1000',
       f'--root_dir={root_dir}'],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  # Interrupt once a round has been saved (any checkpoint: only the last
  # two are kept, and a fast run may have replaced the first by the time
  # it is looked for).
  deadline = time.monotonic() + 300
  while not run_directory.has_checkpoint(root_dir):
    if process.poll() is not None:
      pytest.fail(
          f'The run ended (code {process.returncode}) before its first '
          f'checkpoint: {process.communicate()[1]}'
      )
    assert time.monotonic() < deadline, 'no checkpoint after 300 s'
    time.sleep(0.2)
  process.send_signal(signal.SIGINT)
  # The round in flight finishes first; on a loaded 2-core machine (a clean
  # clone's CI run) that took over 120 s once.
  _, stderr = process.communicate(timeout=300)
  assert process.returncode == 130, stderr
  assert 'Traceback' not in stderr, stderr
  assert 'run the same command again to resume' in stderr
  assert f'--root_dir={root_dir}' in stderr


def test_help_lists_the_flags_by_group_and_exits_0():
  result = subprocess.run(
      [sys.executable, '-m', 'tff_fedrec.programs.train', '--help',
       '--method=fedras'], capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  # The groups fedras takes, with the methods that take each; not the
  # tiered methods' groups.
  assert 'the data set [data; every method]:' in result.stdout
  assert '--alpha (default: ' in result.stdout
  assert "how the item table travels" in result.stdout
  assert "HeteFedRec's training rule" not in result.stdout
  assert 'Traceback' not in result.stderr
