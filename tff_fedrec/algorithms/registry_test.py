"""The registry and the TensorFlow-free list of names agree."""

from tff_fedrec.algorithms import method_names
from tff_fedrec.algorithms import registry


def test_each_family_registers_exactly_its_listed_names():
  assert tuple(registry.METHODS) == method_names.LEAVE_ONE_OUT
  assert tuple(registry.HETERO_METHODS) == method_names.TIERED
  assert tuple(registry.COMPRESSED_METHODS) == method_names.COMPRESSED
  assert tuple(registry.ALL_METHODS) == method_names.ALL
