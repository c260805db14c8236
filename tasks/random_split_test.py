"""HeteFedRec's protocol: the client queue, training negatives, full
ranking and its tie diagnostics."""

import numpy as np
import pytest

from tff_fedrec.tasks import client_selection
from tff_fedrec.tasks import preprocessing
from tff_fedrec.tasks import random_split
from tff_fedrec.tasks import synthetic


def test_each_epoch_takes_every_user_once_in_slices_of_the_queue():
  users = lambda r: client_selection.epoch_round(
      np.arange(10), 4, client_selection.AllClients(), None, 3, r)
  # 10 users, 4 per round: rounds 0-2 are epoch 0 (4 + 4 + 2 users).
  epoch0 = [users(r) for r in range(3)]
  assert [len(u) for u in epoch0] == [4, 4, 2]
  np.testing.assert_array_equal(np.sort(np.concatenate(epoch0)), np.arange(10))
  epoch1 = [users(r) for r in range(3, 6)]
  np.testing.assert_array_equal(np.sort(np.concatenate(epoch1)), np.arange(10))
  # The queue is reshuffled per epoch and fixed by (seed, round).
  assert any(not np.array_equal(a, b) for a, b in zip(epoch0, epoch1))
  np.testing.assert_array_equal(users(4), epoch1[1])


def test_popular_items_are_recommended_and_training_items_are_not():
  # 3 items; item 2 is the most trained, then item 0. Users: u0 trained on
  # items 0 and 2 and tests on 1 (the only item left, rank 1); u1 trained on
  # 2 and tests on 0 (rank 1 of the remaining 0, 1); u2 trained on 0 and 2,
  # tests on 1.
  data = preprocessing.RandomSplitData(
      num_users=3, num_items=3, user_ids=np.arange(3), item_ids=np.arange(3),
      train_offsets=np.array([0, 2, 3, 5]),
      train_items=np.array([0, 2, 2, 0, 2], np.int32),
      test_offsets=np.array([0, 1, 2, 3]),
      test_items=np.array([1, 0, 1], np.int32),
      interacted_offsets=np.array([0, 3, 5, 8]),
      interacted_items=np.array([0, 1, 2, 0, 2, 0, 1, 2], np.int32),
  )
  result = random_split.popularity_metrics(data, np.arange(3), k=1)
  # Every user's single test item is the top remaining item.
  assert result['recall@1'] == 1.0 and result['ndcg@1'] == 1.0
  assert sum(t['users'] for t in result['per_tier'].values()) == 3


def test_a_test_item_below_the_cut_off_is_missed():
  # One user trained on item 0, tests on item 2, but item 1 is more popular
  # among the others and takes the single slot.
  data = preprocessing.RandomSplitData(
      num_users=3, num_items=3, user_ids=np.arange(3), item_ids=np.arange(3),
      train_offsets=np.array([0, 1, 2, 3]),
      train_items=np.array([0, 1, 1], np.int32),
      test_offsets=np.array([0, 1, 2, 3]),
      test_items=np.array([2, 2, 2], np.int32),
      interacted_offsets=np.array([0, 2, 4, 6]),
      interacted_items=np.array([0, 2, 1, 2, 1, 2], np.int32),
  )
  result = random_split.popularity_metrics(data, np.arange(3), k=1)
  # User 0 gets item 1 (missed); users 1 and 2 have only items 0, 2 left and
  # item 0 (1 interaction) beats item 2 (0): missed too.
  assert result['recall@1'] == 0.0


def test_training_negatives_may_be_test_items_but_never_training_items():
  # 4 items. User 0 trained on 0 and 1 and tests on 2; item 3 is nobody's.
  # Its negatives come from {2, 3}: the test item 2 is a possible negative,
  # since excluding it would mark it as the user's (a leak into training).
  data = preprocessing.RandomSplitData(
      num_users=2, num_items=4, user_ids=np.arange(2), item_ids=np.arange(4),
      train_offsets=np.array([0, 2, 3]),
      train_items=np.array([1, 0, 3], np.int32),
      test_offsets=np.array([0, 1, 2]),
      test_items=np.array([2, 0], np.int32),
      interacted_offsets=np.array([0, 3, 5]),
      interacted_items=np.array([0, 1, 2, 0, 3], np.int32),
  )
  negatives = {0: set(), 1: set()}
  for round_num in range(20):
    examples = random_split.training_examples(
        data, 4, np.array([0, 1]), np.random.default_rng([0, round_num])
    )
    for position in (0, 1):
      items, labels = preprocessing.user_examples(examples, position)
      negatives[position] |= set(items[labels == 0].tolist())
  assert negatives[0] == {2, 3}
  assert negatives[1] == {0, 1, 2}


def _protocol(data, **kwargs):
  return random_split.RandomSplit(
      data, user_tiers=np.zeros(data.num_users, np.int32),
      clients_per_round=3, **kwargs)


def _split(num_users=12):
  return preprocessing.random_split(
      preprocessing.index_interactions(synthetic.generate_interactions(
          num_users=num_users, num_items=40, seed=1)),
      seed=0,
  )


def test_negatives_drawn_once_are_each_users_own_in_every_round():
  data = _split()

  def examples(training_negatives, round_num):
    # A new protocol object each time, as a resumed run makes.
    protocol = _protocol(data, training_negatives=training_negatives)
    round_input = protocol.round_input(round_num)
    return {
        user: tuple(np.concatenate([d['items'], d['labels']]))
        for user, d in zip(round_input.users.tolist(), round_input.user_data)
    }

  once = [examples('once', r) for r in range(8)]
  per_round = [examples('per_round', r) for r in range(8)]
  # User u's examples when drawn once are the same in every round it trains
  # in, whoever trains beside it; drawn per round, they change.
  for user in range(data.num_users):
    drawn_once = {rows[user] for rows in once if user in rows}
    drawn_per_round = {rows[user] for rows in per_round if user in rows}
    assert len(drawn_once) == 1
    assert len(drawn_per_round) > 1
    # Each user's positives with 4 negatives each, either way.
    assert {len(rows) for rows in drawn_once} == {
        len(rows) for rows in drawn_per_round}


def test_round_input_is_a_function_of_seed_and_round():
  data = _split()
  first = _protocol(data, seed=5).round_input(2)
  again = _protocol(data, seed=5).round_input(2)
  np.testing.assert_array_equal(first.users, again.users)
  for a, b in zip(first.user_data, again.user_data):
    np.testing.assert_array_equal(a['items'], b['items'])
    np.testing.assert_array_equal(a['seed'], b['seed'])
  other = _protocol(data, seed=6).round_input(2)
  assert not np.array_equal(first.users, other.users) or any(
      not np.array_equal(a['items'], b['items'])
      for a, b in zip(first.user_data, other.user_data))


def test_an_unknown_negatives_schedule_is_refused():
  with pytest.raises(ValueError, match='training_negatives must be one of'):
    _protocol(_split(), training_negatives='per_epoch')


def test_users_whose_model_ties_every_item_are_counted_per_tier():
  # 4 items, 3 users in tiers small / medium / large (ratio 1:1:1 by training
  # size), each testing on item 3. User 0's model is constant over its ranked
  # items 1-3 (its training item 0 scores differently, but is not ranked);
  # user 1's separates items; user 2's is constant, with only item 3 left.
  data = preprocessing.RandomSplitData(
      num_users=3, num_items=4, user_ids=np.arange(3), item_ids=np.arange(4),
      train_offsets=np.array([0, 1, 3, 6]),
      train_items=np.array([0, 0, 1, 0, 1, 2], np.int32),
      test_offsets=np.array([0, 1, 2, 3]),
      test_items=np.array([3, 3, 3], np.int32),
      interacted_offsets=np.array([0, 2, 5, 9]),
      interacted_items=np.array([0, 3, 0, 1, 3, 0, 1, 2, 3], np.int32),
  )
  data_tier = np.array([0, 1, 2])
  model = {0: [9.0, 0.5, 0.5, 0.5], 1: [0.0, 0.0, 0.1, 0.2],
           2: [1.0, 1.0, 1.0, 1.0]}

  def score_users(tier, users, train_offsets, train_items):
    return np.array([model[u] for u in users], np.float32)

  result = random_split.tiered_ranking_metrics(
      data, data_tier, score_users, k=1)
  assert result['tied_users'] == 2
  assert [result['per_tier'][t]['tied_users']
          for t in ('small', 'medium', 'large')] == [1, 0, 1]
  # User 0's tie is broken by item index (item 1, a miss); users 1 and 2
  # rank item 3 first.
  np.testing.assert_allclose(result['recall@1'], 2 / 3)


def test_tied_rows_is_the_same_in_batches_of_any_size():
  rng = np.random.default_rng(0)
  scores = rng.normal(size=(7, 5)).astype(np.float32)
  scores[[1, 4]] = 2.0
  scores[6, 2:] = 0.5
  exclude = np.zeros(scores.shape, bool)
  exclude[6, :2] = True  # Row 6 is tied on its ranked items only.
  want = np.array([0, 1, 0, 0, 1, 0, 1], bool)
  for batch in (1, 3, 256):
    np.testing.assert_array_equal(
        random_split.tied_rows(scores, exclude, batch), want)




def test_round_users_are_the_users_round_input_draws():
  protocol = _protocol(_split())
  for round_num in range(7):
    np.testing.assert_array_equal(protocol.round_users(round_num),
                                  protocol.round_input(round_num).users)
  # A full ranking may score any item: no scored items are given.
  assert protocol.run_data().scored_items is None


def test_a_tier_selection_shortens_the_epoch_and_never_trains_the_tier():
  data = _split()
  tiers = np.arange(data.num_users) % 3
  protocol = random_split.RandomSplit(
      data, user_tiers=tiers, clients_per_round=3,
      selection=client_selection.ExcludeTier(0))
  # 8 users left, 3 a round: 3 rounds an epoch, each user once.
  assert protocol.rounds_per_epoch == protocol.default_eval_every == 3
  epoch = np.concatenate([protocol.round_input(r).users for r in range(3)])
  np.testing.assert_array_equal(np.sort(epoch),
                                np.flatnonzero(tiers != 0))
  assert protocol.summary([{'round': 0, 'test': {}}])['client_selection'] == (
      'tier 0 excluded from training')
