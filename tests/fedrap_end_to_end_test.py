"""End-to-end tests of --method=fedrap: the training binary on synthetic
data, a stopped run resumed to the result of an uninterrupted one, and the
export of each user's own model to TFLite."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tff_fedrec.programs import export_program
from tff_fedrec.programs import program_test_utils
from tff_fedrec.programs import training_program

_summary = program_test_utils.read_summary
_metrics = program_test_utils.read_metrics

_NUM_USERS, _NUM_ITEMS, _DIM = 30, 200, 8
_SMALL_RUN = [
    '--method=fedrap',
    '--dataset=synthetic',
    f'--synthetic_users={_NUM_USERS}',
    f'--synthetic_items={_NUM_ITEMS}',
    f'--embedding_dim={_DIM}',
    '--num_eval_negatives=20',
    '--local_epochs=2',
    '--fedrap_batch_size=32',
    '--fedrap_item_learning_rate=20',
    '--users_per_tff_client=8',
]


def _train(args):
  return program_test_utils.run_main('train', training_program.main, args)




@pytest.fixture(scope='module')
def two_round_run(tmp_path_factory):
  """A 2-round run of the binary, as a user starts it."""
  root_dir = str(tmp_path_factory.mktemp('fedrap'))
  result = subprocess.run(
      [sys.executable, '-m', 'tff_fedrec.programs.train', *_SMALL_RUN,
       '--rounds=2', f'--root_dir={root_dir}'],
      capture_output=True, text=True, timeout=600,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  return root_dir


def test_two_rounds_write_metrics_bytes_and_client_state(two_round_run):
  summary = _summary(two_round_run)
  assert summary['method'] == 'fedrap'
  assert summary['rounds_completed'] == 2
  for key in ('hr@10', 'ndcg@10'):
    assert 0.0 <= summary['test'][key] <= 1.0
  assert summary['test']['ndcg@10'] <= summary['test']['hr@10']
  # C whole, each way, for every user of the round (of the items the
  # synthetic users interacted with).
  table_bytes = summary['num_items'] * _DIM * 4
  assert summary['bytes_per_round'] == {
      'upload': summary['num_users'] * table_bytes,
      'download': summary['num_users'] * table_bytes,
  }
  # The trained rows of D^(i) and D_0's share: less than a dense D^(i).
  assert 0 < summary['client_state_bytes_per_user'] < table_bytes
  assert 0.0 <= summary['global_table_sparsity'] <= 1.0
  assert summary['config']['training']['local_epochs'] == 2
  rows = _metrics(two_round_run)
  assert [int(r['round']) for r in rows] == [0, 1]
  assert all(np.isfinite(float(r['train_loss'])) for r in rows)


def test_a_stopped_run_resumes_to_the_uninterrupted_result(tmp_path):
  whole, parts = str(tmp_path / 'whole'), str(tmp_path / 'parts')
  _train([*_SMALL_RUN, '--rounds=4', f'--root_dir={whole}'])
  _train([*_SMALL_RUN, '--rounds=2', f'--root_dir={parts}'])
  resumed = _train([*_SMALL_RUN, '--rounds=4', f'--root_dir={parts}'])
  assert 'Resumed from checkpoint' in resumed
  expected, actual = _summary(whole), _summary(parts)
  assert actual['rounds_completed'] == 4
  assert actual['best_round'] == expected['best_round']
  program_test_utils.assert_figures_close(actual['test'], expected['test'])
  assert actual['client_state_bytes_per_user'] == (
      expected['client_state_bytes_per_user'])
  for want, got in zip(_metrics(whole), _metrics(parts), strict=True):
    for key in ('train_loss', 'val_hr_at_10', 'test_ndcg_at_10',
                'global_table_sparsity'):
      assert float(got[key]) == pytest.approx(float(want[key]), abs=1e-6)


def test_user_models_export_and_rank_like_the_training_side(two_round_run):
  program_test_utils.run_main('export', export_program.main, [
      f'--root_dir={two_round_run}', '--users=all',
      '--quantizations=float32',
  ])
  with open(os.path.join(two_round_run, 'tflite',
                         'export_report.json')) as f:
    rows = json.load(f)['models']
  users = [r for r in rows if r['user'] is not None]
  assert len(users) == _NUM_USERS
  assert max(r['max_abs_logit_difference'] for r in rows) < 1e-4
  # Each user's model ranks its test case as the run's last evaluation did.
  last = _metrics(two_round_run)[-1]
  for key, column in (('hr@10', 'test_hr_at_10'),
                      ('ndcg@10', 'test_ndcg_at_10')):
    for side in ('tf', 'tflite'):
      assert np.mean([r[side][key] for r in users]) == pytest.approx(
          float(last[column]), abs=1e-6)
