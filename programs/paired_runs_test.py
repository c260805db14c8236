"""A baseline pairs with a run only when it differs in nothing but its
optimisation (and flags that change no result); MDAC from the two
summaries."""

import json

import pytest

from tff_fedrec.programs import paired_runs
from tff_fedrec.programs.flag_groups import group

_FLAGS = {'method': 'pfedrec', 'seed': '0', 'device_tiers': 'dirichlet:0.005',
          'rounds': '100', 'root_dir': '/runs/base',
          'tier_optimization': 'none'}


def _baseline(tmp_path, flags=None, per_tier=None):
  flags = dict(_FLAGS if flags is None else flags)
  (tmp_path / 'run.flags').write_text(
      ''.join(f'--{name}={value}\n' for name, value in flags.items()))
  per_tier = per_tier or {'low': {'hr@10': 0.5}, 'mid': {'hr@10': 0.6},
                          'high': {'hr@10': 0.8}}
  (tmp_path / 'summary.json').write_text(
      json.dumps({'test': {'per_tier': per_tier}}))
  return str(tmp_path)


def _run(**changes):
  return {**_FLAGS, 'root_dir': '/runs/opt',
          'tier_optimization': 'quant:4,8,32', **changes}


def test_a_run_differing_only_in_its_optimisation_and_execution_pairs(
    tmp_path):
  baseline = _baseline(tmp_path)
  paired_runs.check_baseline(baseline, _run())
  paired_runs.check_baseline(
      baseline, _run(users_per_tff_client='1', executor='remote',
                     paired_baseline=baseline, checkpoint_every='5'))


@pytest.mark.parametrize('changes, message', [
    ({'seed': '1'}, "--seed ('0' there, '1' here)"),
    ({'device_tiers': 'round_robin'}, '--device_tiers'),
    ({'rounds': '50'}, '--rounds'),
    ({'model': 'din'}, "--model (None there, 'din' here)"),
])
def test_a_run_that_differs_otherwise_is_refused(tmp_path, changes, message):
  baseline = _baseline(tmp_path)
  with pytest.raises(group.FlagError) as error:
    paired_runs.check_baseline(baseline, _run(**changes))
  assert message in str(error.value)


def test_an_optimised_or_unfinished_baseline_is_refused(tmp_path):
  (tmp_path / 'a').mkdir()
  optimized = _baseline(tmp_path / 'a',
                        {**_FLAGS, 'tier_optimization': 'exclude_low'})
  with pytest.raises(group.FlagError,
                     match='ran --tier_optimization=exclude_low'):
    paired_runs.check_baseline(optimized, _run())
  (tmp_path / 'b').mkdir()
  with pytest.raises(group.FlagError, match='holds no summary.json'):
    paired_runs.check_baseline(str(tmp_path / 'b'), _run())


def test_mdac_is_the_largest_gap_between_relative_changes(tmp_path):
  baseline = _baseline(tmp_path)
  fields = paired_runs.mdac_fields(
      {'low': {'hr@10': 0.4}, 'mid': {'hr@10': 0.6}, 'high': {'hr@10': 0.88}},
      baseline, 'hr@10')
  # Relative changes -20%, 0%, +10%: MDAC = 0.1 - (-0.2).
  assert fields['relative_change'] == pytest.approx(
      {'low': -0.2, 'mid': 0.0, 'high': 0.1})
  assert fields['mdac'] == pytest.approx(0.3)
  assert fields['metric'] == 'hr@10'
  with pytest.raises(ValueError, match='no per-tier test recall@20'):
    paired_runs.mdac_fields({'low': {'recall@20': 0.1}}, baseline,
                            'recall@20')
