"""Tier-aware client selection under both draws (epoch queue, sample)."""

import numpy as np
import pytest

from tff_fedrec.tasks import client_selection

# Users 0-11; tiers 0, 1, 2 dealt in turn.
TIERS = np.arange(12) % 3


def test_a_sample_of_every_user_is_numpys_draw_of_the_indices():
  # The draw a protocol made before selections existed: rng.choice(U, K).
  for seed in range(5):
    expected = np.sort(np.random.default_rng(seed).choice(12, 5,
                                                          replace=False))
    drawn = client_selection.sampled_round(
        np.arange(12), 5, client_selection.AllClients(), TIERS,
        np.random.default_rng(seed))
    np.testing.assert_array_equal(drawn, expected)


def test_a_round_of_every_user_draws_nothing():
  rng = np.random.default_rng(0)
  state = rng.bit_generator.state
  drawn = client_selection.sampled_round(
      np.arange(12), 12, client_selection.Overselect(0.5), TIERS, rng)
  np.testing.assert_array_equal(drawn, np.arange(12))
  assert rng.bit_generator.state == state


@pytest.mark.parametrize('draw', ['epoch', 'sample'])
def test_exclude_lo_never_trains_the_low_tier(draw):
  selection = client_selection.ExcludeTier(0)
  pool = selection.queue(np.arange(12), TIERS)
  np.testing.assert_array_equal(pool, [1, 2, 4, 5, 7, 8, 10, 11])
  for round_num in range(8):
    if draw == 'epoch':
      users = client_selection.epoch_round(pool, 4, selection, TIERS, 0,
                                           round_num)
    else:
      users = client_selection.sampled_round(
          pool, 4, selection, TIERS, np.random.default_rng(round_num))
    assert users.size == 4 and not np.any(TIERS[users] == 0)


def test_an_epoch_of_the_pool_takes_every_user_once():
  pool = client_selection.ExcludeTier(0).queue(np.arange(12), TIERS)
  epoch = [client_selection.epoch_round(
      pool, 3, client_selection.AllClients(), TIERS, 7, r) for r in range(3)]
  assert client_selection.epoch_rounds(pool.size, 3) == 3
  np.testing.assert_array_equal(np.sort(np.concatenate(epoch)), pool)


def _drop_slowest_first(drawn, tiers, keep):
  """The authors' drop, transcribed: remove the extra users from the end
  of the drawn list, lowest tier first."""
  drawn = list(drawn)
  extra = len(drawn) - keep
  for tier in sorted(set(tiers.tolist())):
    for user in reversed(list(drawn)):
      if extra and tiers[user] == tier:
        drawn.remove(user)
        extra -= 1
  return np.sort(drawn)


@pytest.mark.parametrize('seed', range(4))
def test_overselect_drops_the_extra_users_slowest_tier_first(seed):
  selection = client_selection.Overselect(0.5)
  rng = np.random.default_rng(seed)
  drawn = np.random.default_rng(seed).choice(12, 6, replace=False)
  users = client_selection.sampled_round(np.arange(12), 4, selection, TIERS,
                                         rng)
  np.testing.assert_array_equal(users, _drop_slowest_first(drawn, TIERS, 4))
  assert users.size == 4


def test_selections_need_tiers():
  with pytest.raises(ValueError, match='tiers'):
    client_selection.ExcludeTier(0).queue(np.arange(3), None)
  with pytest.raises(ValueError, match='tiers'):
    client_selection.Overselect(0.5).keep(np.arange(3), None, 2)
  with pytest.raises(ValueError, match=r'\(0, 1\]'):
    client_selection.Overselect(0.0)
