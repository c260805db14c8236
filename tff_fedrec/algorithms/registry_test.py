"""The registry: its entries build, and nothing in it needs TensorFlow."""

import subprocess
import sys

import pytest

from tff_fedrec.algorithms import registry


def test_the_registry_reads_without_tensorflow():
  # `benchmark` checks method names without a TensorFlow import (~10 s).
  code = ('import sys; from tff_fedrec.algorithms import registry; '
          'assert registry.METHODS; '
          'assert "tensorflow" not in sys.modules, "imported TensorFlow"')
  subprocess.run([sys.executable, '-c', code], check=True)


def test_every_entry_names_a_builder_taking_data_seed_and_training():
  for entry in registry.METHODS.values():
    assert entry.takes('data') and entry.takes('seed'), entry.name
    assert entry.protocol in (registry.LEAVE_ONE_OUT, registry.RANDOM_SPLIT,
                              registry.CLICK_THROUGH)
    for name, _ in entry.arguments:
      assert entry.takes(name), (entry.name, name)
    # The program's 'training' flag group sets fields of this default.
    if 'training' in entry.flag_groups:
      assert entry.default('training') is not None, entry.name


def test_unknown_methods_are_named_with_the_known_ones():
  with pytest.raises(ValueError, match='Known methods: pfedrec, fedmf'):
    registry.get('fedavg')


def test_methods_taking_a_group_or_protocol():
  assert registry.methods_taking('hetefedrec') == [
      'hetefedrec', 'direct_aggregate', 'clustered', 'all_small',
      'all_large', 'all_large_exclusive',
  ]
  assert 'standalone' in registry.methods_taking('random_split')
  assert 'pfedrec' not in registry.methods_taking('random_split')


def test_a_variant_names_its_base_method():
  assert registry.base_method('apfr_gkd_no_kd') == 'apfr_gkd'
  assert registry.base_method('apfr_gkd_dual') == 'apfr_gkd'
  assert registry.base_method('fedras_e') == 'fedras'
  assert registry.base_method('apfr_gkd') is None
  # The codec baselines fix an argument of a builder no plain entry has.
  assert registry.base_method('topk') is None
