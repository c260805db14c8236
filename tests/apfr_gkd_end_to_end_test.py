"""End-to-end: APFR-GKD and its ablations through the training program.

Each case trains on the synthetic data set in the test process
(`program_test_utils.run_main`, as a user runs `train`), then reads the
run's summary.json and metrics.csv. Expected figures are derived in the
comments, not read from the code under test.
"""

import json
import os

import numpy as np
import pytest

from tff_fedrec.programs import export_program
from tff_fedrec.programs import program_test_utils
from tff_fedrec.programs import training_program

_summary = program_test_utils.read_summary
_metrics = program_test_utils.read_metrics

# No --hidden_units: APFR-GKD's own score MLP (one hidden layer of 32).
_SMALL_RUN = [
    '--dataset=synthetic', '--synthetic_users=40', '--synthetic_items=400',
    '--num_eval_negatives=20', '--embedding_dim=8',
    '--item_learning_rate=50', '--local_epochs=2',
]


def _train(root_dir, args):
  return program_test_utils.run_main(
      'train', training_program.main, [*args, f'--root_dir={root_dir}'])




_SHARES_MODE_RUNS = pytest.mark.xdist_group('apfr_gkd_mode_runs')


@pytest.fixture(scope='module')
def mode_runs(tmp_path_factory):
  """Two-round runs of Unary and Dual on the same data and seed."""
  runs = {}
  for mode in ('unary', 'dual'):
    root_dir = str(tmp_path_factory.mktemp(mode))
    stdout = _train(root_dir, ['--method=apfr_gkd', f'--personalization={mode}',
                               *_SMALL_RUN, '--rounds=2'])
    runs[mode] = (root_dir, stdout)
  return runs


@_SHARES_MODE_RUNS
def test_p_is_printed_and_kept_with_the_mode_the_flag_chose(mode_runs):
  for mode, (root_dir, stdout) in mode_runs.items():
    summary = _summary(root_dir)
    p = summary['heterogeneity']['p']
    assert p > 0
    assert f'heterogeneity P = {p:.4f}' in stdout
    assert summary['personalization'] == mode
    assert summary['heterogeneity']['chosen_by'] == 'flag'
    assert summary['heterogeneity']['threshold'] == 2.0
    assert summary['rounds_completed'] == 2
    for key in ('hr@10', 'ndcg@10'):
      assert 0.0 <= summary['test'][key] <= 1.0
  # P is a property of the data, not of the mode.
  assert (_summary(mode_runs['unary'][0])['heterogeneity']['p']
          == _summary(mode_runs['dual'][0])['heterogeneity']['p'])


@_SHARES_MODE_RUNS
def test_dual_counts_two_exchanges_a_round(mode_runs):
  unary = _summary(mode_runs['unary'][0])
  dual = _summary(mode_runs['dual'][0])
  assert unary['exchanges_per_round'] == 1
  assert dual['exchanges_per_round'] == 2
  # Both phases download the whole model to every client and upload the
  # rows of the same examples: exactly twice Unary's bytes.
  for direction in ('download', 'upload'):
    assert dual['bytes_per_round'][direction] == (
        2 * unary['bytes_per_round'][direction])
  rows = _metrics(mode_runs['dual'][0])
  assert all(float(r['dual_phase_train_loss']) > 0 for r in rows)


@_SHARES_MODE_RUNS
def test_exported_user_models_score_as_the_training_side(mode_runs,
                                                        tmp_path):
  root_dir, _ = mode_runs['dual']
  output_dir = str(tmp_path / 'tflite')
  program_test_utils.run_main('export', export_program.main, [
      f'--root_dir={root_dir}', '--users=all',
      '--quantizations=float32', f'--output_dir={output_dir}'])
  with open(os.path.join(output_dir, 'export_report.json')) as f:
    rows = [r for r in json.load(f)['models'] if r['user'] is not None]
  assert len(rows) == 40
  # Each user's model carries its own trained score layers and rows: the
  # interpreter's logits equal the training side's.
  assert max(r['max_abs_logit_difference'] for r in rows) < 1e-4
  for r in rows:
    assert r['tf']['hr@10'] == r['tflite']['hr@10']


@pytest.mark.parametrize('method_flags', [
    ['--method=apfr_gkd', '--heterogeneity_threshold=0'],
    ['--method=apfr_gkd_unary', '--distillation=listwise',
     '--negative_pool=outside_training'],
    ['--method=apfr_gkd_dual', '--student_start=latest_aggregate'],
    ['--method=apfr_gkd_no_buffer'],
    ['--method=apfr_gkd_no_kd'],
    ['--method=apfr_gkd', '--client_start=own_model', '--user_learning_rate=2'],
    ['--method=apfr_gkd_dual', '--client_start=own_model',
     '--client_fraction=0.5'],
], ids=lambda flags: ' '.join(f.lstrip('-') for f in flags))
def test_two_rounds_of_each_variant(tmp_path, method_flags):
  root_dir = str(tmp_path / 'run')
  _train(root_dir, [*method_flags, *_SMALL_RUN, '--rounds=2'])
  summary = _summary(root_dir)
  name = method_flags[0].split('=')[1]
  assert summary['method'] == name
  assert summary['rounds_completed'] == 2
  config = summary['config']
  # --hidden_units unset: the builder's one hidden layer of 32, not none.
  assert config['hidden_units'] == [32]
  own_model = '--client_start=own_model' in method_flags
  assert config['client_start'] == ('own_model' if own_model else 'download')
  if own_model:
    # One model down (the teacher) and the rows trained up: as Unary's
    # download; the student start is not taken.
    assert config['student_start'] is None
  if name == 'apfr_gkd' and not own_model:
    # Any P >= a threshold of 0: the adapter chooses Dual.
    assert summary['heterogeneity']['chosen_by'] == 'adapter'
    assert summary['personalization'] == 'dual'
  if name in ('apfr_gkd_unary', 'apfr_gkd_dual'):
    assert summary['personalization'] == name.split('_')[-1]
    assert summary['heterogeneity']['chosen_by'] == 'ablation'
  assert config['buffer_size'] == (1 if name == 'apfr_gkd_no_buffer' else 5)
  assert config['distillation']['weight'] == (
      0.0 if name == 'apfr_gkd_no_kd' else 0.1)
  if '--student_start=latest_aggregate' in method_flags:
    # The teacher is a second model in every download.
    assert summary['bytes_per_round']['download'] > 2 * (
        summary['bytes_per_round']['upload'])
  for key in ('hr@10', 'ndcg@10'):
    assert 0.0 <= summary['test'][key] <= 1.0


def test_an_ablation_refuses_a_personalization_it_does_not_run(tmp_path):
  root_dir = str(tmp_path / 'run')
  status, stderr = program_test_utils.exit_status_and_stderr(
      'train', training_program.main,
      ['--method=apfr_gkd_unary', '--personalization=dual', *_SMALL_RUN,
       f'--root_dir={root_dir}'])
  assert status == 2, stderr
  assert 'Traceback' not in stderr
  assert '--personalization=dual' in stderr and 'unary' in stderr
  assert not os.path.exists(os.path.join(root_dir, 'checkpoints'))


@pytest.mark.parametrize('method_flags', [
    ['--method=apfr_gkd_dual'],
    # Each client's own model (merged rows in the store), half the users a
    # round: clients never selected and stale ones across the checkpoint.
    ['--method=apfr_gkd_unary', '--client_start=own_model',
     '--client_fraction=0.5'],
], ids=['dual', 'own_model'])
def test_stopped_and_resumed_run_equals_an_uninterrupted_one(tmp_path,
                                                              method_flags):
  # The buffer (server state) and the users' models (client state) are in
  # the checkpoint: rounds 3-4 after a resume see the same teacher.
  args = [*method_flags, *_SMALL_RUN, '--checkpoint_every=1']
  whole, parts = str(tmp_path / 'whole'), str(tmp_path / 'parts')
  _train(whole, [*args, '--rounds=4'])
  _train(parts, [*args, '--rounds=2'])
  resumed = _train(parts, [*args, '--rounds=4'])
  assert 'Resumed from checkpoint' in resumed
  want, got = _metrics(whole), _metrics(parts)
  assert [r['round'] for r in got] == ['0', '1', '2', '3']
  keys = ['train_loss', 'val_hr_at_10', 'test_ndcg_at_10']
  if '--method=apfr_gkd_dual' in method_flags:
    keys.append('dual_phase_train_loss')
  for a, b in zip(want, got):
    for key in keys:
      assert float(b[key]) == pytest.approx(float(a[key]), abs=1e-6)
  program_test_utils.assert_figures_close(_summary(parts)['test'],
                                          _summary(whole)['test'])
  assert np.isfinite(_summary(parts)['heterogeneity']['p'])
