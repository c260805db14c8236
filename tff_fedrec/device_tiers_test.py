"""RF²'s device tiers: round-robin, and Algorithm 1 against a plain-Python
reading of the reference code's `map_tiers` (spec section 1)."""

import math

import numpy as np
import pytest

from tff_fedrec import device_tiers


def _reference_dirichlet(offsets, items, alpha, seed):
  """`map_tiers` of facebookresearch/RF2 as the spec describes it, with
  dicts and lists, drawing from one seeded generator in the same order."""
  rng = np.random.default_rng(seed)
  item_users = {-1: []}
  for user in range(len(offsets) - 1):
    clicks = items[offsets[user]:offsets[user + 1]]
    if len(clicks) == 0:
      item_users[-1].append(user)
    for item in clicks:
      item_users.setdefault(int(item), []).append(user)
  counted = sorted((len(users), item) for item, users in item_users.items())
  tiers = {0: [], 1: [], 2: []}
  seen = set()
  for _, item in counted[::-1]:
    shares = [math.nan] * 3
    while any(math.isnan(p) for p in shares):
      shares = list(rng.dirichlet([alpha] * 3))
    shares = sorted(shares)[::-1]
    sizes = sorted((len(users), tier) for tier, users in tiers.items())
    to_map = []
    for user in item_users[item]:
      if user not in seen:
        to_map.append(user)
        seen.add(user)
    if not to_map:
      continue
    to_map = list(rng.permutation(to_map))
    scaled = [p * len(to_map) for p in shares]
    tiers[sizes[0][1]] += to_map[:int(scaled[0])]
    tiers[sizes[1][1]] += to_map[int(scaled[0]):int(scaled[0] + scaled[1])]
    tiers[sizes[2][1]] += to_map[int(scaled[0] + scaled[1]):]
  result = np.full(len(offsets) - 1, -1)
  for tier, users in tiers.items():
    result[users] = tier
  return result


def _clicks(num_users, num_items, seed, no_click_users=0):
  """Users with 1 to 12 clicks (repeats included) of popular-first items;
  the last `no_click_users` click nothing."""
  rng = np.random.default_rng(seed)
  counts = rng.integers(1, 13, num_users)
  counts[num_users - no_click_users:] = 0
  popularity = 1.0 / np.arange(1, num_items + 1)
  items = rng.choice(num_items, counts.sum(), p=popularity / popularity.sum())
  return np.concatenate([[0], np.cumsum(counts)]), items


@pytest.mark.parametrize('alpha', [5000.0, 5.0, 0.5, 0.05, 0.005])
@pytest.mark.parametrize('seed', [0, 7])
def test_dirichlet_matches_the_reference_reading(alpha, seed):
  offsets, items = _clicks(300, 40, seed, no_click_users=5)
  np.testing.assert_array_equal(
      device_tiers.dirichlet(offsets, items, alpha, seed),
      _reference_dirichlet(offsets, items, alpha, seed))


def test_ties_of_popularity_take_the_larger_item_first():
  # Items 3 and 5 have two click events each: 5 by users 0 and 1, 3 twice
  # by user 1. At alpha 5000 every share is about 1/3, so n clickers split
  # int(n/3), int(2n/3) - int(n/3), the rest over the tiers in (size,
  # index) order. Item 5 first: users 0 and 1 go to tiers 1 and 2. Item 3
  # first would map user 1 alone to tier 2, then user 0 alone to tier 2.
  tiers = device_tiers.dirichlet([0, 1, 4], [5, 5, 3, 3], 5000.0, seed=0)
  assert sorted(tiers.tolist()) == [1, 2]
  # At the start every tier is empty and the low tier counts as smallest:
  # at alpha 0.005 one share is about 1, so the most popular item's
  # clickers all go to tier 0, the next item's to tier 1.
  tiers = device_tiers.dirichlet([0, 1, 2, 3, 4, 5], [9, 9, 9, 4, 4],
                                 0.005, seed=0)
  np.testing.assert_array_equal(tiers, [0, 0, 0, 1, 1])


def test_a_user_is_mapped_by_its_most_popular_item_once():
  # User 0 clicks the popular item 1 twice and item 2 once: mapped with
  # item 1's clickers and never moved by item 2.
  offsets, items = [0, 3, 4, 5], [1, 2, 1, 1, 2]
  tiers = device_tiers.dirichlet(offsets, items, 0.5, seed=3)
  np.testing.assert_array_equal(
      tiers, _reference_dirichlet(offsets, items, 0.5, 3))
  assert set(tiers.tolist()) <= {0, 1, 2}


def _top_tier_share(tiers, offsets, items, top=10):
  """Mean over the `top` most clicked items of the largest share of one
  tier among their clickers (RF² Fig. 4: 1/3 when tiers are unrelated)."""
  shares = []
  users = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
  for item in np.argsort(-np.bincount(items), kind='stable')[:top]:
    clickers = np.unique(users[items == item])
    shares.append(np.bincount(tiers[clickers], minlength=3).max()
                  / clickers.size)
  return float(np.mean(shares))


def test_smaller_alpha_puts_an_item_s_clickers_in_one_tier():
  offsets, items = _clicks(3000, 300, seed=1)
  shares = [
      _top_tier_share(device_tiers.dirichlet(offsets, items, alpha, 0),
                      offsets, items)
      for alpha in (5000.0, 0.5, 0.005)
  ]
  assert shares[0] < 0.45 < shares[1] < shares[2]
  robin = device_tiers.round_robin(np.diff(offsets))
  assert _top_tier_share(robin, offsets, items) < 0.45


def test_dirichlet_is_deterministic_given_its_seed():
  offsets, items = _clicks(500, 50, seed=2)
  first = device_tiers.dirichlet(offsets, items, 0.05, seed=11)
  np.testing.assert_array_equal(
      first, device_tiers.dirichlet(offsets, items, 0.05, seed=11))
  assert np.any(first != device_tiers.dirichlet(offsets, items, 0.05, 12))
  assert first.dtype == np.int32 and set(first.tolist()) == {0, 1, 2}


def test_round_robin_deals_tiers_by_training_examples_most_first():
  np.testing.assert_array_equal(
      device_tiers.round_robin([1, 5, 0, 5, 3]), [0, 0, 1, 1, 2])
  sizes = np.bincount(device_tiers.round_robin(np.arange(100)), minlength=3)
  assert sizes.max() - sizes.min() <= 1


@pytest.mark.parametrize('offsets, items, alpha, message', [
    ([0, 2], [1], 0.5, 'CSR offsets'),
    ([1, 2], [1, 2], 0.5, 'CSR offsets'),
    ([0, 2, 1], [1, 2], 0.5, 'CSR offsets'),
    ([0, 1], [-3], 0.5, 'item ids >= 0'),
    ([0, 1], [1], 0.0, 'alpha must be a finite number above 0'),
    ([0, 1], [1], math.nan, 'alpha must be a finite number above 0'),
    ([0, 1], [1], math.inf, 'alpha must be a finite number above 0'),
])
def test_bad_inputs_are_named(offsets, items, alpha, message):
  with pytest.raises(ValueError, match=message):
    device_tiers.dirichlet(offsets, items, alpha, seed=0)


def test_round_robin_refuses_negative_counts():
  with pytest.raises(ValueError, match='counts >= 0'):
    device_tiers.round_robin([3, -1])


def test_policies_of_the_flag_values_assign_from_training_items():
  offsets, items = _clicks(200, 30, seed=4)
  policy = device_tiers.policy_from_flag('dirichlet:0.05')
  assert policy.description == 'device tiers dirichlet:0.05'
  assert policy.tier_names == ('low', 'mid', 'high')
  np.testing.assert_array_equal(
      policy.assign(offsets, items, seed=5),
      device_tiers.dirichlet(offsets, items, 0.05, seed=5))
  level = device_tiers.policy_from_flag('dirichlet:vhigh')
  assert level.alpha == 0.005
  robin = device_tiers.policy_from_flag('round_robin')
  np.testing.assert_array_equal(robin.assign(offsets, items, seed=5),
                                device_tiers.round_robin(np.diff(offsets)))


@pytest.mark.parametrize('value', [
    'random', 'dirichlet', 'dirichlet:', 'dirichlet:0', 'dirichlet:-1',
    'dirichlet:nan', 'dirichlet:inf', 'dirichlet:x', 'round_robin:3'])
def test_other_flag_values_are_refused_naming_the_choices(value):
  with pytest.raises(ValueError, match='give round_robin or dirichlet:ALPHA'):
    device_tiers.policy_from_flag(value)
