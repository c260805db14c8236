"""MDAC (RF² Eq. 1) on hand-made per-tier AUCs."""

import itertools

import pytest

from tff_fedrec import fairness

_BASELINE = {'low': 0.80, 'mid': 0.75, 'high': 0.70}


def test_relative_changes_are_per_tier_fractions_of_the_baseline():
  changes = fairness.relative_changes(
      _BASELINE, {'low': 0.76, 'mid': 0.75, 'high': 0.714})
  assert changes == pytest.approx({'low': -0.05, 'mid': 0.0, 'high': 0.02})


def test_mdac_is_the_largest_pairwise_difference_of_the_changes():
  optimized = {'low': 0.76, 'mid': 0.75, 'high': 0.714}
  changes = fairness.relative_changes(_BASELINE, optimized)
  pairwise = max(abs(changes[a] - changes[b])
                 for a, b in itertools.permutations(changes, 2))
  # low -5 %, high +2 %: 7 percentage points; not the largest absolute
  # change (5 %), nor the spread of the AUCs themselves.
  assert fairness.mdac(_BASELINE, optimized) == pytest.approx(0.07)
  assert fairness.mdac(_BASELINE, optimized) == pytest.approx(pairwise)


def test_equal_changes_are_fair_whatever_their_size():
  optimized = {tier: auc * 0.9 for tier, auc in _BASELINE.items()}
  assert fairness.mdac(_BASELINE, optimized) == pytest.approx(0.0, abs=1e-12)
  # Equal absolute losses are not equal relative ones.
  optimized = {tier: auc - 0.05 for tier, auc in _BASELINE.items()}
  assert fairness.mdac(_BASELINE, optimized) == pytest.approx(
      0.05 / 0.70 - 0.05 / 0.80)


def test_unpaired_or_degenerate_runs_are_refused():
  with pytest.raises(ValueError, match='other tiers'):
    fairness.mdac(_BASELINE, {'low': 0.8, 'mid': 0.7})
  with pytest.raises(ValueError, match='above 0'):
    fairness.mdac({'low': 0.0, 'mid': 0.7}, {'low': 0.5, 'mid': 0.7})
  with pytest.raises(ValueError, match='compares tiers'):
    fairness.mdac({'low': 0.8}, {'low': 0.7})
