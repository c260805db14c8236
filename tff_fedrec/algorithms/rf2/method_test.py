"""rf2 through the training program: 2-round runs on device tiers, resume
equality, MDAC against a paired baseline (recomputed from the two
summaries), Exclude Lo reported and applied, bytes per tier, refusals,
and the per-tier TFLite export checked in the interpreter."""

import json

import numpy as np
import pytest

from tff_fedrec.programs import export_program
from tff_fedrec.programs import program_test_utils
from tff_fedrec.programs import training_program

_RUN = ['--method=rf2', '--dataset=synthetic', '--synthetic_users=60',
        '--synthetic_items=40', '--clients_per_round=20',
        '--users_per_tff_client=4', '--device_tiers=dirichlet:0.05']


def _train(root_dir, *args):
  return program_test_utils.run_main(
      'train', training_program.main,
      [*_RUN, f'--root_dir={root_dir}', *args])


def test_trains_resumes_and_reports_per_tier(tmp_path):
  whole, parts = tmp_path / 'whole', tmp_path / 'parts'
  args = ['--tier_optimization=quants:2,4,32', '--eval_every=1']
  stdout = _train(whole, '--rounds=3', *args)
  _train(parts, '--rounds=2', *args)
  _train(parts, '--rounds=3', *args)  # Resumes from round 2's checkpoint.
  summary = program_test_utils.read_summary(whole)
  assert 'test AUC / log-loss (last round)' in stdout
  assert set(summary['test']['per_tier']) == {'low', 'mid', 'high'}
  assert summary['config']['tier_optimization'] == 'quants:2,4,32'
  program_test_utils.assert_figures_close(
      program_test_utils.read_summary(parts)['test'], summary['test'])
  sent = summary['upload_bytes_per_client']
  # QuantS at b bits + a sign bit, plus max |x| (4 bytes) per tensor,
  # against 32-bit floats: the model's tensor sizes from its byte count
  # (32 I + 16 (G + 1) + 16 + 3 * 256 + 256 + 256 + 1 floats, d = 16 and
  # G = 0 here).
  items = (summary['model_bytes'] // 4 - 16 - 16 - 3 * 256 - 513) // 32
  sizes = [16 * items, 16, 16 * (items + 1), 3 * 256, 256, 256, 1]
  assert sent['high'] == 4 * sum(sizes)
  for tier, bits in (('low', 2), ('mid', 4)):
    assert sent[tier] == sum(np.ceil(n * (bits + 1) / 8) + 4 for n in sizes)
  assert 0.0 < summary['test']['auc'] < 1.0


def test_mdac_is_measured_against_the_paired_baseline(tmp_path):
  baseline, optimized = tmp_path / 'none', tmp_path / 'exclude'
  _train(baseline, '--epochs=1')
  _train(optimized, '--epochs=1', '--tier_optimization=exclude_low',
         f'--paired_baseline={baseline}')
  base = program_test_utils.read_summary(baseline)['test']['per_tier']
  summary = program_test_utils.read_summary(optimized)
  # An epoch: every client once, 20 a round (60 users: 3 rounds); without
  # the low tier's clients, fewer.
  assert program_test_utils.read_summary(baseline)['rounds_completed'] == 3
  assert summary['rounds_completed'] == summary['rounds_per_epoch'] < 3
  # A baseline of another seed, mapping or optimisation is refused before
  # any training.
  for args, why in ((['--seed=1'], "--seed ('0' there, '1' here)"),
                    (['--device_tiers=round_robin'], '--device_tiers'),
                    (['--model=din'], '--model')):
    program_test_utils.refused(
        'train', training_program.main,
        [*_RUN, f'--root_dir={tmp_path / "other"}', *args,
         '--tier_optimization=quant:8,16,32',
         f'--paired_baseline={baseline}'], why)
  program_test_utils.refused(
      'train', training_program.main,
      [*_RUN, f'--root_dir={tmp_path / "other"}',
       f'--paired_baseline={optimized}'],
      'ran --tier_optimization=exclude_low')
  changes = {tier: (summary['test']['per_tier'][tier]['auc']
                    - base[tier]['auc']) / base[tier]['auc']
             for tier in base}
  assert summary['mdac']['mdac'] == pytest.approx(
      max(changes.values()) - min(changes.values()), abs=1e-12)
  assert summary['mdac']['relative_change'] == pytest.approx(changes)
  # The low tier never trained: no upload of its was counted.
  assert 'low' not in summary['upload_bytes_per_client']
  assert summary['client_selection'] == 'tier 0 excluded from training'


@pytest.mark.parametrize('args, message', [
    (['--tier_optimization=quant:8,16'], 'three numbers'),
    (['--tier_optimization=topk'], 'not a tier optimisation'),
    (['--model=mf'], 'takes dlrm, din'),
    (['--paired_baseline=/nonexistent'], 'holds no summary.json'),
    (['--server_learning_rate=-1'], 'above 0'),
    (['--epochs=2', '--rounds=5'], 'not both'),
])
def test_bad_flags_are_refused(tmp_path, args, message):
  program_test_utils.refused('train', training_program.main,
                             [*_RUN, f'--root_dir={tmp_path}', *args],
                             message)


def test_other_methods_refuse_rf2s_flags(tmp_path):
  base = ['--dataset=synthetic', f'--root_dir={tmp_path}']
  program_test_utils.refused(
      'train', training_program.main,
      ['--method=pfedrec', '--server_learning_rate=0.1', *base],
      '--server_learning_rate does not apply to --method=pfedrec')
  program_test_utils.refused(
      'train', training_program.main,
      ['--method=fedras', '--model=dlrm', *base],
      '--model=dlrm does not apply to --method=fedras')


def test_each_tier_exports_a_tflite_model_that_scores_as_the_run(tmp_path):
  root = tmp_path / 'run'
  _train(root, '--rounds=2', '--tier_optimization=channel:0.25,0.5,1')
  program_test_utils.run_main(
      'export', export_program.main,
      [f'--root_dir={root}', '--quantizations=float32,full_integer'])
  with open(root / 'tflite' / 'export_report.json') as file:
    report = json.load(file)['models']
  summary = program_test_utils.read_summary(root)
  assert [(r['tier'], r['quantization']) for r in report] == [
      (tier, q) for tier in ('low', 'mid', 'high')
      for q in ('float32', 'full_integer')]
  for row in report:
    tier = summary['test']['per_tier'][row['tier']]
    assert row['tf']['events'] == tier['events']
    if row['quantization'] == 'float32':
      assert row['max_abs_logit_difference'] < 1e-5
      assert row['tflite']['auc'] == pytest.approx(row['tf']['auc'],
                                                   abs=1e-6)
    else:  # int8: close logits (AUCs of a 2-round model move with ties).
      assert row['max_abs_logit_difference'] < 0.05 * (
          1 + row['max_abs_logit'])
  # The high tier keeps every unit: its model is the run's global model,
  # scored as the run scored it; the low tier runs its Channel sub-model.
  high = next(r for r in report if r['tier'] == 'high')
  assert high['tf']['auc'] == pytest.approx(
      summary['test']['per_tier']['high']['auc'], abs=1e-6)
  files = sorted(p.relative_to(root / 'tflite').as_posix()
                 for p in (root / 'tflite').rglob('*.tflite'))
  assert files == sorted(f'tier_{t}/{q}.tflite'
                         for t in ('low', 'mid', 'high')
                         for q in ('float32', 'full_integer'))


def test_overselect_draws_more_clients_a_round_and_trains_fewer_rounds(
    tmp_path):
  _train(tmp_path, '--epochs=1', '--tier_optimization=overselect:0.5')
  summary = program_test_utils.read_summary(tmp_path)
  # 30 drawn a round, 20 kept: 60 users in ceil(60 / 30) = 2 rounds.
  assert summary['rounds_per_epoch'] == summary['rounds_completed'] == 2
  assert summary['client_selection'] == (
      'overselect 0.5, slowest tiers dropped')
