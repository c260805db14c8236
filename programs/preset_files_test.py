"""The preset each method runs with."""

import os

from tff_fedrec.programs import preset_files


def _name(method, dataset):
  path = preset_files.preset_path(method, dataset)
  return None if path is None else os.path.basename(path)


def test_a_method_runs_with_its_own_preset():
  assert _name('apfr_gkd', 'ml-100k') == 'apfr_gkd_ml100k.flags'
  assert _name('fedras_e', 'ml-100k') == 'fedras_e_ml100k.flags'


def test_an_ablation_without_a_preset_runs_with_its_methods():
  # Else apfr_gkd_no_kd would run without what the preset sets beyond the
  # defaults (--client_start=own_model): more than the ablation changes.
  assert _name('apfr_gkd_no_kd', 'ml-100k') == 'apfr_gkd_ml100k.flags'
  assert _name('apfr_gkd_dual', 'ml-1m') == 'apfr_gkd_ml1m.flags'


def test_without_a_preset_the_method_runs_with_its_defaults():
  assert preset_files.preset_path('apfr_gkd_no_kd', 'synthetic') is None
  assert preset_files.preset_flags('fedrecon', 'ml-1m') == [
      '--method=fedrecon', '--dataset=ml-1m']
  assert preset_files.preset_flags('pfedrec', 'ml-1m')[0].endswith(
      'pfedrec_ml1m.flags')
