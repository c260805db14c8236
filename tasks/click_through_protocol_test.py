"""The click-through protocol: epochs without replacement, RF²'s client
selections against per-round readings of the authors' code, round inputs
holding exactly a user's training events, and per-tier AUC / log-loss
against sklearn-style metrics on a hand scorer."""

import collections

import numpy as np
import pandas as pd
import pytest

from tff_fedrec import metrics
from tff_fedrec.algorithms import method as method_lib
from tff_fedrec.tasks import click_through
from tff_fedrec.tasks import click_through_protocol as protocol_lib
from tff_fedrec.tasks import client_selection


def _split(num_users=40, seed=0):
  rng = np.random.default_rng(seed)
  rows = 30 * num_users
  frame = pd.DataFrame({
      'user': rng.integers(0, num_users, rows),
      'item': rng.integers(0, 25, rows),
      'rating': rng.integers(1, 6, rows).astype(np.float64),
      'timestamp': rng.integers(0, 1000, rows).astype(np.float64)})
  genres = {item: ('a',) if item % 2 else ('a', 'b') for item in range(25)}
  return protocol_lib.ClickThroughSplit.of(
      click_through.click_through_split(frame, genres))


def _tiers(n):
  return np.arange(n) % 3


def test_every_client_trains_once_an_epoch():
  data = _split()
  protocol = protocol_lib.ClickThrough(data, user_tiers=_tiers(40),
                                       clients_per_round=12, seed=3)
  assert protocol.rounds_per_epoch == 4
  for epoch in range(2):
    users = np.concatenate([protocol.round_users(epoch * 4 + r)
                            for r in range(4)])
    np.testing.assert_array_equal(np.sort(users), np.arange(40))
  # Another epoch, another order.
  assert not np.array_equal(protocol.round_users(0), protocol.round_users(4))


def test_exclude_low_leaves_the_low_tier_out_of_every_round():
  data = _split()
  tiers = _tiers(40)
  protocol = protocol_lib.ClickThrough(
      data, user_tiers=tiers, clients_per_round=12,
      selection=client_selection.ExcludeTier(0))
  # 26 clients of tiers 1 and 2: ceil(26 / 12) = 3 rounds an epoch.
  assert protocol.rounds_per_epoch == 3
  users = np.concatenate([protocol.round_users(r) for r in range(3)])
  np.testing.assert_array_equal(np.sort(users), np.flatnonzero(tiers > 0))


def _code_overselect(drawn, tiers, keep):
  """The authors' server: drop the extra ones low tier first, each from
  the end of its tier's list in the round."""
  by_tier = {t: [u for u in drawn if tiers[u] == t] for t in range(3)}
  extra = len(drawn) - keep
  for tier in range(3):
    while extra and by_tier[tier]:
      by_tier[tier].pop()
      extra -= 1
  return sorted(u for t in range(3) for u in by_tier[t])


def test_overselect_drops_the_extra_clients_lowest_tier_first():
  data = _split()
  rng = np.random.default_rng(0)
  tiers = rng.choice(3, 40, p=[0.1, 0.3, 0.6])
  protocol = protocol_lib.ClickThrough(
      data, user_tiers=tiers, clients_per_round=10,
      selection=client_selection.Overselect(0.5))
  assert protocol.rounds_per_epoch == 3  # ceil(40 / 15).
  for round_num in range(3):
    epoch_order = np.random.default_rng([0, 0, 1]).permutation(40)
    drawn = epoch_order[round_num * 15:(round_num + 1) * 15]
    assert protocol.round_users(round_num).tolist() == _code_overselect(
        drawn.tolist(), tiers, 10)
  # The low tier is dropped before any mid client is.
  first = protocol.round_users(0)
  drawn = np.random.default_rng([0, 0, 1]).permutation(40)[:15]
  assert not np.isin(drawn[tiers[drawn] == 0], first).any()


def test_a_round_gives_each_user_its_training_events_only():
  data = _split()
  protocol = protocol_lib.ClickThrough(data, user_tiers=_tiers(40),
                                       clients_per_round=7)
  round_input = protocol.round_input(2)
  events = data.events
  for user, user_data in zip(round_input.users, round_input.user_data):
    rows = np.flatnonzero((events.user == user) & events.train)
    np.testing.assert_array_equal(user_data['item'], events.item[rows])
    np.testing.assert_array_equal(user_data['history'], events.history[rows])
    np.testing.assert_array_equal(user_data['label'], events.label[rows])
  np.testing.assert_array_equal(
      protocol.round_input(2).user_data[0]['seed'],
      round_input.user_data[0]['seed'])


class _ItemScorer:
  """Scores an event by a fixed logit per movie."""

  def __init__(self, logit_of_item):
    self.logit_of_item = logit_of_item

  def score(self, server_state, store, examples):
    assert isinstance(examples, method_lib.FeatureRows)
    return self.logit_of_item[examples.features['item']]


def test_evaluation_is_auc_and_log_loss_of_the_test_events_per_tier():
  data = _split()
  tiers = _tiers(40)
  protocol = protocol_lib.ClickThrough(data, user_tiers=tiers)
  logit = np.random.default_rng(1).normal(size=25)
  result = protocol.evaluate(_ItemScorer(logit), None, None)['test']
  events = data.events
  test = ~events.train
  p = 1 / (1 + np.exp(-logit[events.item]))
  assert result['auc'] == pytest.approx(
      metrics.binary_auc(events.label[test], logit[events.item[test]]))
  assert result['log_loss'] == pytest.approx(
      metrics.log_loss(events.label[test], p[test]))
  for tier, name in enumerate(('low', 'mid', 'high')):
    rows = test & (tiers[events.user] == tier)
    assert result['per_tier'][name]['events'] == rows.sum()
    assert result['per_tier'][name]['auc'] == pytest.approx(
        metrics.binary_auc(events.label[rows], logit[events.item[rows]]))


def test_refuses_a_selection_that_leaves_nobody():
  with pytest.raises(ValueError, match='No client is left'):
    protocol_lib.ClickThrough(_split(), user_tiers=np.zeros(40, int),
                              selection=client_selection.ExcludeTier(0))
  with pytest.raises(ValueError, match='clients_per_round'):
    protocol_lib.ClickThrough(_split(), user_tiers=_tiers(40),
                              clients_per_round=41)
