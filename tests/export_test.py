"""End-to-end: train a run, export it to TFLite, check the files on the
interpreter against the training side.

The PFedRec pipeline runs `python -m tff_fedrec.programs.train` and then
`python -m tff_fedrec.programs.export` in subprocesses, as a user does, so
both binaries are checked end to end. The other cases call the programs'
`main` in the test process (`_train`, `_export`, `_refusal`): a subprocess
costs a TensorFlow import, about 10 s, more than most cases. An export is a
transaction (`export_directory`); the cases that stop one half-way (kill -9,
Ctrl-C) or set its umask start the binary too.
"""

import csv
import glob
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.parse

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec.export import manifest
from tff_fedrec.programs import export_program
from tff_fedrec.programs import program_test_utils
from tff_fedrec.programs import training_program

_PFEDREC = [
    '--method=pfedrec', '--dataset=synthetic', '--synthetic_users=12',
    '--synthetic_items=600', '--num_eval_negatives=20', '--embedding_dim=8',
    '--item_learning_rate=50',
    '--rounds=2',
]
_TIERED = [
    '--dataset=synthetic', '--synthetic_users=40', '--synthetic_items=150',
    '--clients_per_round=20', '--tier_widths=2,4,8', '--rounds=2',
    '--eval_every=1',
]


def _program(name, args, timeout=600, **popen_args):
  return subprocess.run(
      [sys.executable, '-m', f'tff_fedrec.programs.{name}', *args],
      capture_output=True, text=True, timeout=timeout, **popen_args,
  )


def _train(root_dir, args):
  program_test_utils.run_main(
      'train', training_program.main, [*args, f'--root_dir={root_dir}']
  )


def _export(args):
  program_test_utils.run_main('export', export_program.main, args)


def _report(output_dir):
  with open(os.path.join(output_dir, 'export_report.json')) as f:
    return json.load(f)


# pytest-xdist (make test) keeps the tests that share a module fixture on
# one worker, so the fixture's runs are trained once.
_SHARES_PFEDREC_EXPORT = pytest.mark.xdist_group('pfedrec_export')
_SHARES_ONE_ROUND_RUNS = pytest.mark.xdist_group('one_round_runs')


@pytest.fixture(scope='module')
def pfedrec_export(tmp_path_factory):
  root_dir = str(tmp_path_factory.mktemp('pfedrec'))
  result = _program('train', [*_PFEDREC, f'--root_dir={root_dir}'])
  assert result.returncode == 0, result.stderr[-3000:]
  result = _program('export', [
      f'--root_dir={root_dir}', '--users=all', '--quantizations=float32',
  ])
  assert result.returncode == 0, result.stderr[-3000:]
  return root_dir, os.path.join(root_dir, 'tflite')


@_SHARES_PFEDREC_EXPORT
def test_pfedrec_user_models_rank_like_the_training_side(pfedrec_export):
  root_dir, output_dir = pfedrec_export
  rows = [r for r in _report(output_dir)['models'] if r['user'] is not None]
  assert len(rows) == 12
  # Each user's own model (personal score function and fine-tuned rows)
  # ranked its test case; their mean is the run's last-round test HR@10.
  with open(os.path.join(root_dir, 'metrics.csv')) as f:
    last = list(csv.DictReader(f))[-1]
  for key, column in (('hr@10', 'test_hr_at_10'),
                      ('ndcg@10', 'test_ndcg_at_10')):
    assert np.mean([r['tf'][key] for r in rows]) == pytest.approx(
        float(last[column]), abs=1e-6
    )
    assert np.mean([r['tflite'][key] for r in rows]) == pytest.approx(
        float(last[column]), abs=1e-6
    )
  assert max(r['max_abs_logit_difference'] for r in rows) < 1e-5


@_SHARES_PFEDREC_EXPORT
def test_manifest_lists_every_file_with_its_checksum(pfedrec_export):
  _, output_dir = pfedrec_export
  entries = manifest.read_manifest(output_dir, verify=True)
  assert {e.tier for e in entries} == {'single'}
  assert sum(e.user is None for e in entries) == 1  # The global model.
  users = sorted(e.user for e in entries if e.user is not None)
  assert len(users) == 12 and all(e.embedding_dim == 8 for e in entries)
  for entry in entries:
    path = os.path.join(output_dir, entry.path)
    assert os.path.getsize(path) == entry.size_bytes
  # One data-set item id per model row, distinct.
  item_ids = _item_ids(output_dir)
  assert 0 < len(item_ids) <= 600 and len(set(item_ids)) == len(item_ids)


def _item_ids(output_dir):
  with open(os.path.join(output_dir, 'item_ids.json')) as f:
    return json.load(f)


@_SHARES_PFEDREC_EXPORT
def test_top_k_of_an_exported_user_model_skips_the_seen_items(pfedrec_export):
  _, output_dir = pfedrec_export
  entry = next(e for e in manifest.read_manifest(output_dir)
               if e.user is not None)
  with open(os.path.join(output_dir, entry.path), 'rb') as f:
    interpreter = tf.lite.Interpreter(model_content=f.read())
  score = interpreter.get_signature_runner('score')
  top_k = interpreter.get_signature_runner('top_k')
  num_items = len(_item_ids(output_dir))
  scores = score(item_ids=np.arange(num_items, dtype=np.int32))['scores']
  seen = np.argsort(-scores)[:5].astype(np.int32)  # The 5 best are "seen".
  result = top_k(exclude_ids=seen)
  assert not set(result['item_ids'].tolist()) & set(seen.tolist())
  expected = [i for i in np.argsort(-scores, kind='stable')
              if i not in seen][:10]
  np.testing.assert_array_equal(result['item_ids'], expected)
  np.testing.assert_allclose(result['scores'], scores[expected], rtol=1e-6)


@pytest.mark.parametrize('method_flags', [
    ['--method=fedmf'],
    ['--method=fedncf', '--dual_personalization'],
    ['--method=fedrecon'],
], ids=lambda flags: ' '.join(f.lstrip('-') for f in flags))
def test_every_leave_one_out_method_exports_what_its_tf_model_scores(
    tmp_path, method_flags
):
  root_dir = str(tmp_path / 'run')
  _train(root_dir, [*_PFEDREC[1:-1], *method_flags, '--rounds=1'])
  _export([
      f'--root_dir={root_dir}', '--users=u0,u7',
      '--quantizations=float32,float16',
  ])
  rows = _report(os.path.join(root_dir, 'tflite'))['models']
  # The global model (user vector as input) and the two users' own models.
  assert [(r['user'], r['quantization']) for r in rows] == [
      (user, q) for user in (None, 'u0', 'u7') for q in ('float32', 'float16')
  ]
  for row in rows:
    if row['quantization'] == 'float32':
      assert row['max_abs_logit_difference'] < 1e-5
      assert row['tflite'] == pytest.approx(row['tf'], abs=1e-9)
    else:
      assert row['max_abs_logit_difference'] < 1e-2


def test_tier_models_of_hetefedrec_rank_like_the_training_side(tmp_path):
  root_dir = str(tmp_path / 'hetefedrec')
  _train(root_dir, ['--method=hetefedrec', *_TIERED])
  # float16 and dynamic range are checked on the leave-one-out models.
  _export([f'--root_dir={root_dir}', '--quantizations=float32,full_integer'])
  with open(os.path.join(root_dir, 'summary.json')) as f:
    per_tier = json.load(f)['test']['per_tier']
  rows = _report(os.path.join(root_dir, 'tflite'))['models']
  assert {(r['tier'], r['quantization']) for r in rows} == {
      (t, q) for t in ('small', 'medium', 'large')
      for q in ('float32', 'full_integer')
  }
  for row in rows:
    expected = per_tier[row['tier']]
    for key in ('recall@20', 'ndcg@20'):
      # The TF model the file was made from ranks as training did.
      assert row['tf'][key] == pytest.approx(expected[key], abs=1e-9)
      if row['quantization'] == 'float32':
        assert row['tflite'][key] == pytest.approx(expected[key], abs=1e-9)
    if row['quantization'] == 'float32':
      assert row['max_abs_logit_difference'] < 1e-5
    assert row['max_abs_logit_difference'] < 0.1


@pytest.fixture(scope='module')
def one_round_runs(tmp_path_factory):
  """One-round all_small and standalone runs, trained once for the tests
  below: a refused export writes nothing, so they share the runs."""
  runs = {}
  for method in ('all_small', 'standalone'):
    runs[method] = str(tmp_path_factory.mktemp(method))
    _train(runs[method], [f'--method={method}', *_TIERED, '--rounds=1'])
  return runs


def _refusal(args) -> str:
  """Runs `export_program.main` with `args` as the binary would.

  Asserts the exit status is 2 (a usage error) and that no traceback was
  printed; returns stderr.
  """
  status, stderr = program_test_utils.exit_status_and_stderr(
      'export', export_program.main, args
  )
  assert status == 2, stderr
  assert 'Traceback' not in stderr
  return stderr


@_SHARES_ONE_ROUND_RUNS
@pytest.mark.parametrize('method, args, message', [
    ('all_small', ['--tiers=large'], "trains no 'large' model"),
    ('standalone', ['--tiers=small'], 'every user trains its own'),
    ('standalone', ['--users=nosuchuser'], 'Unknown user id'),
    ('all_small', ['--quantizations=int4'], 'Unknown quantization int4'),
    ('all_small', ['--quantizations=float32,'],
     'Unknown quantization "" (an empty entry)'),
    ('all_small', ['--tiers='], 'nothing would be exported'),
])
def test_export_refuses_what_the_run_cannot_give(
    one_round_runs, method, args, message
):
  root_dir = one_round_runs[method]
  assert message in _refusal([f'--root_dir={root_dir}', *args])
  assert not os.path.exists(os.path.join(root_dir, 'tflite', 'manifest.json'))


@_SHARES_ONE_ROUND_RUNS
def test_standalone_users_export_their_own_models(tmp_path, one_round_runs):
  root_dir = str(tmp_path / 'standalone')
  shutil.copytree(one_round_runs['standalone'], root_dir)
  _export([
      f'--root_dir={root_dir}', '--users=u0,u1', '--quantizations=float32',
  ])
  rows = _report(os.path.join(root_dir, 'tflite'))['models']
  assert [r['user'] for r in rows] == ['u0', 'u1']
  assert all(r['max_abs_logit_difference'] < 1e-5 for r in rows)
  assert all(r['tf'] == pytest.approx(r['tflite'], abs=1e-9) for r in rows)


@_SHARES_ONE_ROUND_RUNS
def test_a_directory_without_a_run_or_checkpoint_is_refused(
    tmp_path, one_round_runs
):
  stderr = _refusal([f'--root_dir={tmp_path}'])
  assert 'not a training run directory' in stderr
  # A run that wrote its flags but no checkpoint yet.
  root_dir = str(tmp_path / 'fresh')
  shutil.copytree(one_round_runs['all_small'], root_dir)
  for name in os.listdir(os.path.join(root_dir, 'checkpoints')):
    os.rename(os.path.join(root_dir, 'checkpoints', name),
              os.path.join(root_dir, 'checkpoints', f'old_{name}'))
  assert 'has no checkpoint yet' in _refusal([f'--root_dir={root_dir}'])


# User ids a data file may hold that are no safe file names: a path out of
# the export folder, its parent, ids equal up to case, unicode with a space,
# a Windows device name, hidden, a drive path, a separator of --users, and
# one far longer than a file name may be.
_ODD_IDS = [
    'x/../../../escaped', '..', 'U0', 'u0', 'Ünï cödé', 'CON', '.hidden',
    'C:\\x', 'tab,comma', '%41', 'A', 'a' * 300,
]
_LONG_ID = 'a' * 300
_SHARES_ODD_IDS_RUN = pytest.mark.xdist_group('odd_ids_run')


@pytest.fixture(scope='module')
def odd_ids_run(tmp_path_factory):
  """A one-round PFedRec run on a tab-separated file whose user ids are
  `_ODD_IDS` (8 of 40 items each), never changed by the tests."""
  folder = tmp_path_factory.mktemp('odd_ids')
  data_path = folder / 'ratings.tsv'
  data_path.write_text(''.join(
      f'{user}\ti{(n * 7 + k * 3) % 40}\t1\t{n * 8 + k}\n'
      for n, user in enumerate(_ODD_IDS) for k in range(8)
  ), encoding='utf-8')
  root_dir = str(folder / 'run')
  _train(root_dir, [
      '--method=pfedrec', f'--data_path={data_path}', '--separator=\\t',
      '--num_eval_negatives=10', '--embedding_dim=8', '--rounds=1',
  ])
  return root_dir


_snapshot = program_test_utils.snapshot


@_SHARES_ODD_IDS_RUN
def test_users_with_any_id_export_under_encoded_names(odd_ids_run, tmp_path):
  output_dir = str(tmp_path / 'out' / 'tflite')
  _export([f'--root_dir={odd_ids_run}', '--users=all',
           '--quantizations=float32', f'--output_dir={output_dir}'])
  entries = manifest.read_manifest(output_dir, verify=True)
  by_user = {e.user: e for e in entries if e.user is not None}
  # The manifest keeps each id as it is in the data.
  assert sorted(by_user) == sorted(_ODD_IDS)
  folders = [e.path.split('/')[0] for e in entries]
  # One folder per model, distinct even on a case-insensitive file system,
  # each a name of its own in the export folder: nothing got out of it.
  assert len({f.lower() for f in folders}) == len(entries)
  assert all(e.path.count('/') == 1 for e in entries)
  assert os.listdir(tmp_path) == ['out']
  assert os.listdir(tmp_path / 'out') == ['tflite']
  assert sorted(os.listdir(output_dir)) == sorted(
      [*folders, 'manifest.json', 'item_ids.json', 'export_report.json'])
  unsafe = by_user['x/../../../escaped']
  assert unsafe.path == (
      'user_x%2F%2E%2E%2F%2E%2E%2F%2E%2E%2Fescaped/float32.tflite')
  assert urllib.parse.unquote(unsafe.path.split('/')[0][5:]) == unsafe.user
  # Each file is that user's own model, whole, and runs in the interpreter.
  num_items = len(_item_ids(output_dir))
  scores = {}
  for user in ('x/../../../escaped', _LONG_ID, 'U0', 'u0'):
    path = os.path.join(output_dir, by_user[user].path)
    with open(path, 'rb') as f:
      interpreter = tf.lite.Interpreter(model_content=f.read())
    scores[user] = interpreter.get_signature_runner('score')(
        item_ids=np.arange(num_items, dtype=np.int32))['scores']
    assert scores[user].shape == (num_items,)
    assert np.all(np.isfinite(scores[user]))
  # Ids equal up to case are two users with two models.
  assert not np.array_equal(scores['U0'], scores['u0'])
  rows = {r['user']: r for r in _report(output_dir)['models']}
  assert rows[_LONG_ID]['max_abs_logit_difference'] < 1e-5


def _deep_folder(root, length) -> str:
  """A folder under `root` whose path is `length` characters long."""
  path = str(root)
  while len(path) < length:
    path = os.path.join(path, 'd' * min(200, length - len(path) - 1))
  assert len(path) == length
  return path


@_SHARES_ODD_IDS_RUN
def test_a_failed_export_leaves_the_earlier_export_as_it_was(
    odd_ids_run, tmp_path
):
  # Writing the long id's folder fails half-way through the export for a
  # real reason, the path being longer than the system allows (as a full
  # disk fails a write), after the tier and u0 models are written:
  # their paths are about 50 characters shorter than the limit, the long
  # id's folder about 100 characters longer.
  path_max = os.pathconf(tmp_path, 'PC_PATH_MAX')
  output_dir = _deep_folder(tmp_path, path_max - 108)
  _export([f'--root_dir={odd_ids_run}', '--users=u0',
           '--quantizations=float16', f'--output_dir={output_dir}'])
  before = _snapshot(output_dir)
  entries = manifest.read_manifest(output_dir, verify=True)
  assert len(entries) == 2
  # Another --top_k changes every model's bytes, another quantization adds
  # files: a write into the earlier export would show.
  stderr = _refusal([
      f'--root_dir={odd_ids_run}', f'--users=u0,{_LONG_ID}',
      '--quantizations=float16,float32', '--top_k=5',
      f'--output_dir={output_dir}',
  ])
  assert 'Writing the export failed: [Errno 36] File name too long' in stderr
  assert f'--output_dir={output_dir} is as it was' in stderr
  assert _snapshot(output_dir) == before
  assert manifest.read_manifest(output_dir, verify=True) == entries
  # Nothing is left beside it.
  assert os.listdir(os.path.dirname(output_dir)) == [
      os.path.basename(output_dir)]


# argv: MODULE ARGS...; runs MODULE as `python -m MODULE ARGS...` would, with
# SIGINT raising KeyboardInterrupt whatever disposition was inherited.
_RUN_MODULE_WITH_SIGINT_HANDLED = (
    'import runpy, signal, sys\n'
    'signal.signal(signal.SIGINT, signal.default_int_handler)\n'
    'module = sys.argv.pop(1)\n'
    'runpy.run_module(module, run_name="__main__", alter_sys=True)\n'
)


def _stop_export_half_way(root_dir, output_dir, signal_number, log_path):
  """Starts exporting every user of `root_dir` to `output_dir`, sends
  `signal_number` once the export has written its first model file, and
  returns the exit status."""
  with open(log_path, 'wb') as log:
    process = subprocess.Popen(
        [sys.executable, '-c', _RUN_MODULE_WITH_SIGINT_HANDLED,
         'tff_fedrec.programs.export', f'--root_dir={root_dir}',
         '--users=all', '--quantizations=float32,float16,dynamic_range',
         f'--output_dir={output_dir}'],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
      staged = os.path.join(os.path.dirname(output_dir),
                            f'.{os.path.basename(output_dir)}.*', '*',
                            '*.tflite')
      deadline = time.monotonic() + 300
      while not glob.glob(staged):
        assert process.poll() is None, open(log_path).read()
        assert time.monotonic() < deadline
        time.sleep(0.02)
      # To the export and whatever it started: the session is its own.
      os.killpg(process.pid, signal_number)
      return process.wait(timeout=120)
    finally:
      if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@_SHARES_ODD_IDS_RUN
def test_a_killed_export_leaves_the_earlier_one_and_the_next_cleans_up(
    odd_ids_run, tmp_path
):
  output_dir = str(tmp_path / 'tflite')
  _export([f'--root_dir={odd_ids_run}', '--users=u0',
           '--quantizations=float32', f'--output_dir={output_dir}'])
  before = _snapshot(output_dir)
  entries = manifest.read_manifest(output_dir, verify=True)
  status = _stop_export_half_way(odd_ids_run, output_dir, signal.SIGKILL,
                                 tmp_path / 'export.log')
  assert status == -signal.SIGKILL
  leftovers = [name for name in os.listdir(tmp_path) if name.startswith('.')]
  assert len(leftovers) == 1, leftovers
  assert _snapshot(output_dir) == before
  assert manifest.read_manifest(output_dir, verify=True) == entries
  # The next export replaces the earlier one and deletes the leftover.
  _export([f'--root_dir={odd_ids_run}', '--users=U0',
           '--quantizations=float32', f'--output_dir={output_dir}'])
  assert sorted(os.listdir(tmp_path)) == ['export.log', 'tflite']
  assert [e.user for e in manifest.read_manifest(output_dir, verify=True)
          ] == [None, 'U0']


@_SHARES_ODD_IDS_RUN
def test_ctrl_c_half_way_leaves_the_earlier_export_and_nothing_beside_it(
    odd_ids_run, tmp_path
):
  output_dir = str(tmp_path / 'tflite')
  _export([f'--root_dir={odd_ids_run}', '--users=u0',
           '--quantizations=float32', f'--output_dir={output_dir}'])
  before = _snapshot(output_dir)
  log_path = tmp_path / 'export.log'
  status = _stop_export_half_way(odd_ids_run, output_dir, signal.SIGINT,
                                 log_path)
  log = log_path.read_text()
  assert status == 130, log
  assert 'Interrupted. Nothing was exported: --output_dir is as it was' in log
  assert 'Traceback' not in log
  assert _snapshot(output_dir) == before
  assert sorted(os.listdir(tmp_path)) == ['export.log', 'tflite']


@_SHARES_ODD_IDS_RUN
def test_exported_files_follow_the_umask(odd_ids_run, tmp_path):
  output_dir = tmp_path / 'shared' / 'tflite'
  result = _program('export', [
      f'--root_dir={odd_ids_run}', '--users=u0',
      '--quantizations=float32', f'--output_dir={output_dir}',
  ], umask=0o027)
  assert result.returncode == 0, result.stderr[-3000:]
  modes = {path: stat.S_IMODE(os.stat(output_dir / path).st_mode)
           for path in _snapshot(output_dir)}
  # tempfile.mkstemp, which writes them, gives files 0o600.
  assert modes == {
      'manifest.json': 0o640, 'item_ids.json': 0o640,
      'export_report.json': 0o640, 'tier_single': 0o750,
      'tier_single/float32.tflite': 0o640, 'user_u0': 0o750,
      'user_u0/float32.tflite': 0o640,
  }
  for folder in (output_dir, output_dir.parent):
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o750


@_SHARES_ODD_IDS_RUN
def test_empty_quantizations_are_refused_before_anything_is_written(
    odd_ids_run, tmp_path
):
  run_before = _snapshot(odd_ids_run)
  output_dir = tmp_path / 'tflite'
  stderr = _refusal([f'--root_dir={odd_ids_run}', '--quantizations=',
                     f'--output_dir={output_dir}'])
  assert ('--quantizations is empty, so nothing would be exported: give one '
          'or more of float32, float16, dynamic_range, full_integer') in stderr
  assert os.listdir(tmp_path) == []
  assert _snapshot(odd_ids_run) == run_before


@_SHARES_ODD_IDS_RUN
def test_a_folder_that_is_not_an_export_is_not_replaced(odd_ids_run):
  before = _snapshot(odd_ids_run)
  stderr = _refusal([f'--root_dir={odd_ids_run}', '--quantizations=float32',
                     f'--output_dir={odd_ids_run}'])
  assert f'--output_dir={odd_ids_run} holds files that are not an export' in (
      stderr)
  assert 'run.flags' in stderr
  assert _snapshot(odd_ids_run) == before
