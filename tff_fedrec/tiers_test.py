"""Tests of the client tiers by data size (HeteFedRec Sec. IV.A, Table VI)."""

import numpy as np
import pytest

from tff_fedrec import tiers


def test_tier_names():
  assert tiers.TIER_NAMES == ('small', 'medium', 'large')


def test_default_ratio_splits_ten_users_five_three_two_by_count():
  # Distinct counts in shuffled order; 5:3:2 of 10 users gives boundaries
  # [5, 8, 10]: the 5 fewest are small, the next 3 medium, the 2 most large.
  counts = np.array([40, 3, 90, 12, 7, 65, 21, 100, 1, 30])
  got = tiers.assign_tiers_by_interactions(counts)

  assert got.dtype == np.int32
  assert got.shape == (10,)
  by_count = got[np.argsort(counts)]
  np.testing.assert_array_equal(by_count, [0, 0, 0, 0, 0, 1, 1, 1, 2, 2])
  np.testing.assert_array_equal(tiers.tier_sizes(got), [5, 3, 2])


def test_docstring_example():
  got = tiers.assign_tiers_by_interactions([9, 1, 5, 7], ratio=(2, 1, 1))

  np.testing.assert_array_equal(got, [2, 0, 0, 1])


def test_ties_keep_user_order():
  # All six users tie; a stable sort keeps them in user order, so with 1:1:1
  # (boundaries [2, 4, 6]) users 0-1 are small, 2-3 medium, 4-5 large.
  got = tiers.assign_tiers_by_interactions([4] * 6, ratio=(1, 1, 1))

  np.testing.assert_array_equal(got, [0, 0, 1, 1, 2, 2])


def test_ties_across_a_boundary_are_split_by_user_order():
  # Sorted: user 1 (2), then users 0, 2, 3 (all 5). 1:1:2 of 4 users gives
  # boundaries [1, 2, 4]: user 1 small, user 0 medium, users 2 and 3 large.
  got = tiers.assign_tiers_by_interactions([5, 2, 5, 5], ratio=(1, 1, 2))

  np.testing.assert_array_equal(got, [1, 0, 2, 2])


def test_equal_ratio_on_nine_users():
  counts = np.arange(9)[::-1]
  got = tiers.assign_tiers_by_interactions(counts, ratio=(1, 1, 1))

  np.testing.assert_array_equal(got, [2, 2, 2, 1, 1, 1, 0, 0, 0])
  np.testing.assert_array_equal(tiers.tier_sizes(got), [3, 3, 3])


@pytest.mark.parametrize(
    'ratio,expected_sizes',
    [
        pytest.param((1, 0, 0), [7, 0, 0], id='all small'),
        pytest.param((0, 0, 10), [0, 0, 7], id='all large'),
        pytest.param((0, 1, 0), [0, 7, 0], id='all medium'),
        # Boundaries round(7 * [0.5, 0.5, 1]) = [4, 4, 7]: 3.5 rounds to 4.
        pytest.param((1, 0, 1), [4, 0, 3], id='empty middle tier'),
    ],
)
def test_zeros_in_the_ratio_leave_tiers_empty(ratio, expected_sizes):
  got = tiers.assign_tiers_by_interactions(np.arange(7), ratio=ratio)

  np.testing.assert_array_equal(tiers.tier_sizes(got), expected_sizes)
  # Tiers never decrease with the number of interactions.
  assert np.all(np.diff(got) >= 0)


def test_boundaries_round_half_to_even():
  # 5:3:2 of 5 users: round([2.5, 4, 5]) = [2, 4, 5].
  got = tiers.assign_tiers_by_interactions(np.arange(5))

  np.testing.assert_array_equal(got, [0, 0, 1, 1, 2])


def test_no_users():
  got = tiers.assign_tiers_by_interactions(np.zeros([0], np.int64))

  assert got.shape == (0,)
  assert got.dtype == np.int32
  np.testing.assert_array_equal(tiers.tier_sizes(got), [0, 0, 0])


@pytest.mark.parametrize(
    'ratio,message',
    [
        pytest.param((5, 3), '3 numbers', id='two numbers'),
        pytest.param((5, 3, 2, 1), '3 numbers', id='four numbers'),
        pytest.param((5, -1, 2), 'non-negative', id='negative'),
        pytest.param((5, float('nan'), 2), 'finite', id='nan'),
        pytest.param((0, 0, 0), 'positive sum', id='zero sum'),
    ],
)
def test_bad_ratio_raises(ratio, message):
  with pytest.raises(ValueError, match=message):
    tiers.assign_tiers_by_interactions(np.arange(10), ratio=ratio)


def test_counts_must_be_one_dimensional():
  with pytest.raises(ValueError, match='1-D'):
    tiers.assign_tiers_by_interactions(np.ones([2, 3]))


def test_tier_sizes_rejects_values_outside_the_tiers():
  with pytest.raises(ValueError, match='0..2'):
    tiers.tier_sizes([0, 1, 3])
  with pytest.raises(ValueError, match='0..2'):
    tiers.tier_sizes([-1, 0])


@pytest.mark.parametrize(
    'assign',
    [
        pytest.param(tiers.assign_tiers_by_interactions, id='function'),
        pytest.param(
            lambda counts: tiers.ByInteractions().assign(
                np.concatenate([[0], np.cumsum(counts)])),
            id='policy'),
    ],
)
def test_the_default_ratio_is_five_three_two_on_a_hundred_users(assign):
  # Ten users cannot tell 5:3:2 from 5:4:2 or 6:3:2 (both round to
  # 5, 3, 2); a hundred give 50, 30, 20 against 45, 37, 18 or 55, 27, 18.
  counts = np.random.default_rng(0).permutation(100)
  got = assign(counts)

  np.testing.assert_array_equal(tiers.tier_sizes(got), [50, 30, 20])
  np.testing.assert_array_equal(got[np.argsort(counts)],
                                [0] * 50 + [1] * 30 + [2] * 20)


def test_the_policy_keeps_its_ratio_and_ignores_the_seed():
  policy = tiers.ByInteractions((2, 1, 1))
  offsets = np.concatenate([[0], np.cumsum([9, 1, 5, 7])])  # The counts.

  assert policy.ratio == (2.0, 1.0, 1.0)
  assert policy.tier_names == ('small', 'medium', 'large')
  assert policy.description == 'by interactions 2:1:1'
  for seed in (0, 1, 7):
    np.testing.assert_array_equal(
        policy.assign(offsets, np.zeros(22, np.int64), seed), [2, 0, 0, 1])
