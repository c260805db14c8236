"""--tier_optimization's values: the paper's 14 parse to the code's
settings, and bad values are refused naming the problem."""

import pytest

from tff_fedrec import tier_codecs
from tff_fedrec import tier_optimizations

UpdateCodec = tier_codecs.UpdateCodec


def test_the_papers_fourteen_parse_to_the_codes_settings():
  parsed = {v: tier_optimizations.parse(v)
            for v in tier_optimizations.PAPER_CONFIGURATIONS}
  assert len(parsed) == 14
  assert parsed['exclude_low'].selection == 'exclude_low'
  assert parsed['overselect:0.2'].overselect_share == 0.2
  assert parsed['prune:0.875,0.75,0'].codecs == (
      UpdateCodec('prune', 0.875), UpdateCodec('prune', 0.75),
      UpdateCodec('prune', 0.0))
  assert parsed['quants:2,4,32'].codecs[0] == UpdateCodec('quants', 2)
  assert parsed['quants:2,4,32'].codecs[2].untouched
  assert parsed['channel:0.0625,0.25,1'].channel_multipliers == (
      0.0625, 0.25, 1.0)
  assert parsed['channel:0.0625,0.25,1'].codecs == (UpdateCodec(),) * 3
  assert tier_optimizations.parse('none') == tier_optimizations.TierOptimization()


@pytest.mark.parametrize('value, message', [
    ('quant:8,16', 'three numbers'),
    ('quant:8,16,33', 'Bits must be'),
    ('quant:8.5,16,32', 'Bits must be'),
    ('prune:1,0.5,0', 'prune rate'),
    ('channel:0,0.5,1', r'\(0, 1\]'),
    ('overselect:0', r'\(0, 1\]'),
    ('overselect:x', r'\(0, 1\]'),
    ('topk:0.1', 'not a tier optimisation'),
    ('exclude_low:1', 'not a tier optimisation'),
])
def test_bad_values_are_refused_naming_the_problem(value, message):
  with pytest.raises(ValueError, match=message):
    tier_optimizations.parse(value)
