"""End-to-end: train a run, export it to TFLite, check the files on the
interpreter against the training side.

The PFedRec pipeline runs `python -m tff_fedrec.programs.train` and then
`python -m tff_fedrec.programs.export` in subprocesses, as a user does, so
both binaries are checked end to end. The other cases call the programs'
`main` in the test process (`_train`, `_export`, `_refusal`): a subprocess
costs a TensorFlow import, about 10 s, more than most cases.
"""

import csv
import json
import os
import shutil
import subprocess
import sys

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


def _program(name, args, timeout=600):
  return subprocess.run(
      [sys.executable, '-m', f'tff_fedrec.programs.{name}', *args],
      capture_output=True, text=True, timeout=timeout,
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
