"""--tier_optimization for methods other than rf2, through the training
program: 2-round runs of PFedRec (leave-one-out) and FedRAP with device
tiers, their uploads encoded by tier and their clients selected by tier,
MDAC against a paired baseline recomputed from the two summaries, and the
refusals."""

import pytest

from tff_fedrec.programs import program_test_utils
from tff_fedrec.programs import training_program

_DATA = ['--dataset=synthetic', '--synthetic_users=60', '--synthetic_items=120',
         '--num_eval_negatives=29',
         '--device_tiers=round_robin', '--rounds=2', '--eval_every=1']


def _train(root_dir, method, *args):
  return program_test_utils.run_main(
      'train', training_program.main,
      [f'--method={method}', *_DATA, f'--root_dir={root_dir}', *args])


def _assert_mdac_recomputed(summary, baseline, metric):
  base = baseline['test']['per_tier']
  changes = {tier: (summary['test']['per_tier'][tier][metric]
                    - base[tier][metric]) / base[tier][metric]
             for tier in base}
  assert summary['mdac']['relative_change'] == pytest.approx(changes)
  assert summary['mdac']['mdac'] == pytest.approx(
      max(changes.values()) - min(changes.values()), abs=1e-12)
  assert summary['mdac']['metric'] == metric


def test_pfedrec_encodes_uploads_by_tier_against_its_baseline(tmp_path):
  _train(tmp_path / 'none', 'pfedrec')
  stdout = _train(tmp_path / 'quant', 'pfedrec',
                  '--tier_optimization=quant:2,4,32',
                  f'--paired_baseline={tmp_path / "none"}')
  baseline = program_test_utils.read_summary(tmp_path / 'none')
  summary = program_test_utils.read_summary(tmp_path / 'quant')
  assert 'MDAC vs the paired baseline' in stdout
  _assert_mdac_recomputed(summary, baseline, 'hr@10')
  sent = summary['upload_bytes_per_client']
  assert set(sent) == {'low', 'mid', 'high'}
  # 2 and 4 bits against 32 (plus 8 bytes of range per tensor): the low
  # tier's messages about 1/16 of the high tier's, the mid tier's 1/8.
  assert sent['low'] < sent['mid'] < sent['high']
  # The encoding changes what the server averages, so the runs differ.
  assert summary['test']['per_tier'] != baseline['test']['per_tier']


def test_fedrap_excludes_the_low_tier_and_prunes_its_messages(tmp_path):
  _train(tmp_path / 'none', 'fedrap', '--clients_per_round=20')
  _train(tmp_path / 'exclude', 'fedrap', '--clients_per_round=20',
         '--tier_optimization=exclude_low',
         f'--paired_baseline={tmp_path / "none"}')
  _train(tmp_path / 'prune', 'fedrap', '--clients_per_round=20',
         '--tier_optimization=prune:0.75,0.5,0')
  baseline = program_test_utils.read_summary(tmp_path / 'none')
  excluded = program_test_utils.read_summary(tmp_path / 'exclude')
  pruned = program_test_utils.read_summary(tmp_path / 'prune')
  assert excluded['client_selection'] == 'tier 0 excluded from training'
  _assert_mdac_recomputed(excluded, baseline, 'hr@10')
  sent = pruned['upload_bytes_per_client']
  # A message is the whole [I, d] table delta: 4 bytes an entry untouched,
  # about a quarter and a half of them kept (plus the 8-byte mask seed).
  entries = 120 * 32
  assert sent['high'] == 4 * entries
  assert sent['low'] == pytest.approx(0.25 * 4 * entries + 8, rel=0.2)
  assert sent['mid'] == pytest.approx(0.5 * 4 * entries + 8, rel=0.2)


@pytest.mark.parametrize('method, args, message', [
    ('fedrecon', ['--tier_optimization=quant:4,8,32'],
     'fedrecon does not encode its uploads by device tier'),
    ('pfedrec', ['--tier_optimization=channel:0.25,0.5,1'],
     'only rf2'),
    ('pfedrec', ['--tier_optimization=quant:4,8'], 'three numbers'),
])
def test_what_a_method_cannot_apply_is_refused(tmp_path, method, args,
                                               message):
  program_test_utils.refused(
      'train', training_program.main,
      [f'--method={method}', *_DATA, f'--root_dir={tmp_path}', *args],
      message)
