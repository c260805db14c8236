"""PFedRec's leave-one-out protocol: sampling and the reported round."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from tff_fedrec.tasks import client_selection
from tff_fedrec.tasks import leave_one_out
from tff_fedrec.tasks import preprocessing


def _data(num_users=6, num_items=40, per_user=6):
  rows = [
      (f'u{u}', f'i{(u * 7 + k) % num_items}', 5.0, float(k))
      for u in range(num_users)
      for k in range(per_user)
  ]
  frame = pd.DataFrame(rows, columns=['user', 'item', 'rating', 'timestamp'])
  indexed = preprocessing.index_interactions(frame)
  return preprocessing.leave_one_out_split(
      indexed, num_eval_negatives=5, seed=0
  )


def test_best_row_takes_the_latest_of_equal_validation_hr():
  # The reference code updates the best round when val_hr >= best so far.
  rows = [{'round': r, 'val_hr@10': v}
          for r, v in enumerate([0.1, 0.5, 0.3, 0.5, 0.2])]
  assert leave_one_out.best_row(rows)['round'] == 3


def test_sample_round_is_a_function_of_seed_and_round():
  data = _data()
  protocol = leave_one_out.LeaveOneOut(data, clients_per_round=4, seed=5)
  sample = lambda r: (protocol.round_input(r).users,
                      protocol.round_input(r).user_data)
  users_a, data_a = sample(1)
  users_b, data_b = sample(1)
  users_c, data_c = sample(2)
  np.testing.assert_array_equal(users_a, users_b)
  for a, b in zip(data_a, data_b):
    np.testing.assert_array_equal(a['items'], b['items'])
  assert len(users_a) == 4 and np.all(np.diff(users_a) > 0)
  assert not all(
      np.array_equal(a['items'], c['items']) for a, c in zip(data_a, data_c)
  ) or not np.array_equal(users_a, users_c)


def test_sample_round_gives_each_user_its_positives_and_four_negatives():
  data = _data()
  round_input = leave_one_out.LeaveOneOut(
      data, clients_per_round=data.num_users).round_input(0)
  users, client_data = round_input.users, round_input.user_data
  examples = round_input.examples
  np.testing.assert_array_equal(users, np.arange(data.num_users))
  for user, example in zip(users, client_data):
    positives = data.train_items[
        data.train_offsets[user] : data.train_offsets[user + 1]
    ]
    interacted = data.interacted_items[
        data.interacted_offsets[user] : data.interacted_offsets[user + 1]
    ]
    labels = example['labels']
    assert labels.sum() == positives.size
    assert labels.size == 5 * positives.size
    assert sorted(example['items'][labels == 1]) == sorted(positives)
    assert not np.isin(example['items'][labels == 0], interacted).any()
    assert example['items'].dtype == np.int32
    assert example['seed'].shape == (2,)
    # The client data is the user's segment of the round's examples.
    np.testing.assert_array_equal(
        example['items'],
        examples.items[examples.offsets[user]:examples.offsets[user + 1]],
    )


def test_summary_reports_test_metrics_at_the_best_validation_round():
  per_tier = lambda hr: {'small': {'hr@10': hr, 'ndcg@10': 0.0,
                                   'users': 6}}
  rows = [
      {'round': 0, 'train_loss': 1.0},
      {'round': 1, 'val_hr@10': 0.4, 'val_ndcg@10': 0.2, 'test_hr@10': 0.3,
       'test_ndcg@10': 0.1, 'test_auc': 0.6, 'test_per_tier': per_tier(0.3)},
      {'round': 2, 'val_hr@10': 0.3, 'val_ndcg@10': 0.1, 'test_hr@10': 0.5,
       'test_ndcg@10': 0.3, 'test_auc': 0.7, 'test_per_tier': per_tier(0.5)},
  ]
  summary = leave_one_out.LeaveOneOut(
      _data(), clients_per_round=2).summary(rows)
  assert summary['best_round'] == 2  # 1-based: the row of round 1.
  assert summary['test'] == {'hr@10': 0.3, 'ndcg@10': 0.1, 'auc': 0.6,
                             'per_tier': per_tier(0.3)}
  assert summary['final_round_test'] == {'hr@10': 0.5, 'ndcg@10': 0.3}


class _RankAt:
  """A method whose users rank their held-out item at given ranks: the
  positive (candidate 0) scores below `rank - 1` of the negatives."""

  def __init__(self, ranks):
    self._ranks = np.asarray(ranks)

  def score(self, server_state, store, examples):
    del server_state, store
    users, items = examples.users, examples.items
    scores = -np.tile(np.arange(items.shape[1], dtype=np.float32),
                      [users.size, 1])
    scores[:, 0] = -(self._ranks[users] - 1) - 0.5
    return scores


def test_evaluation_reports_every_tier_of_users():
  data = _data()  # 6 users, 5 evaluation negatives: 6 candidates each.
  # Ranks 1..6; HR@10 is 1 for everyone, NDCG@10 1 / log2(rank + 1).
  ranks = np.array([1, 2, 3, 4, 5, 6])
  user_tiers = np.array([0, 0, 2, 2, 2, 0])
  protocol = leave_one_out.LeaveOneOut(
      data, clients_per_round=2, user_tiers=user_tiers)

  got = protocol.evaluate(_RankAt(ranks), None, None)

  ndcg = 1.0 / np.log2(ranks + 1)
  assert got['test_ndcg@10'] == pytest.approx(ndcg.mean())
  assert got['test_per_tier'] == {
      'small': {'hr@10': 1.0, 'ndcg@10': pytest.approx(ndcg[[0, 1, 5]].mean()),
                'users': 3},
      'large': {'hr@10': 1.0, 'ndcg@10': pytest.approx(ndcg[[2, 3, 4]].mean()),
                'users': 3},
  }
  # Without the run's tiers there is nothing per tier.
  untiered = leave_one_out.LeaveOneOut(data, clients_per_round=2).evaluate(
      _RankAt(ranks), None, None)
  assert untiered['test_per_tier'] == {}


def test_too_many_clients_per_round_are_refused():
  with pytest.raises(ValueError, match=r'clients_per_round must be in \[1, 6\]'):
    leave_one_out.LeaveOneOut(_data(), clients_per_round=7)


def _training_negatives(protocol, rounds):
  """{user: every training negative drawn for it over `rounds` rounds}."""
  drawn = {}
  for round_num in range(rounds):
    round_input = protocol.round_input(round_num)
    for user, example in zip(round_input.users, round_input.user_data):
      drawn.setdefault(int(user), []).extend(
          example['items'][example['labels'] == 0].tolist())
  return drawn


def _segment(offsets, items, user):
  return items[offsets[user] : offsets[user + 1]]


def test_the_papers_pool_never_draws_an_item_the_user_interacted_with():
  data = _data()
  drawn = _training_negatives(
      leave_one_out.LeaveOneOut(data, clients_per_round=data.num_users), 30)
  for user, negatives in drawn.items():
    assert not np.isin(negatives, [data.val_items[user],
                                   data.test_items[user]]).any()
    assert not np.isin(negatives, _segment(
        data.train_offsets, data.train_items, user)).any()


def test_the_leak_free_pool_draws_held_out_items_as_often_as_eval_negatives():
  # 4 training items per user: the pool is the other I - 4 items (31 of
  # the 35 items the data use), held-out items and evaluation negatives
  # alike, each drawn uniformly.
  data = _data()
  expected = 200 * 16 / (data.num_items - 4)
  protocol = leave_one_out.LeaveOneOut(
      data, clients_per_round=data.num_users,
      negative_pool='outside_training')
  drawn = _training_negatives(protocol, 200)
  held_out, eval_negative = [], []
  for user, negatives in drawn.items():
    assert not np.isin(negatives, _segment(
        data.train_offsets, data.train_items, user)).any()
    counts = np.bincount(negatives, minlength=data.num_items)
    held_out += [counts[data.val_items[user]], counts[data.test_items[user]]]
    eval_negative += counts[data.test_negatives[user]].tolist()
  # 200 rounds x 16 draws over 31 items: about 103 draws per item and
  # user, standard deviation about 10; the mean of 12 held-out counts is
  # within 10 of it by > 3 sigma, that of 30 evaluation negatives by more.
  assert data.num_items == 35
  assert np.mean(held_out) == pytest.approx(expected, abs=10)
  assert np.mean(eval_negative) == pytest.approx(expected, abs=10)
  assert min(held_out) > 0


def test_the_evaluation_negatives_do_not_depend_on_the_pool():
  data = _data()
  for pool in leave_one_out.NEGATIVE_POOLS:
    protocol = leave_one_out.LeaveOneOut(
        data, clients_per_round=data.num_users, negative_pool=pool)
    assert protocol.data is data
  # Validation and test negatives are disjoint, never interacted with.
  for user in range(data.num_users):
    assert not np.intersect1d(data.val_negatives[user],
                              data.test_negatives[user]).size
    assert not np.isin(np.concatenate([data.val_negatives[user],
                                       data.test_negatives[user]]),
                       _segment(data.interacted_offsets,
                                data.interacted_items, user)).any()


def test_an_unknown_negative_pool_is_refused():
  with pytest.raises(ValueError, match='negative_pool must be one of'):
    leave_one_out.LeaveOneOut(_data(), clients_per_round=2,
                              negative_pool='everything')


@pytest.mark.parametrize('clients_per_round', [2, 6])
def test_round_users_are_the_users_round_input_draws(clients_per_round):
  protocol = leave_one_out.LeaveOneOut(
      _data(), clients_per_round=clients_per_round, seed=3)
  for round_num in range(5):
    np.testing.assert_array_equal(protocol.round_users(round_num),
                                  protocol.round_input(round_num).users)


def test_the_scored_items_are_each_users_validation_and_test_candidates():
  data = _data()
  offsets, items = leave_one_out.LeaveOneOut(
      data, clients_per_round=6).run_data().scored_items
  for user in range(data.num_users):
    expected = sorted({int(data.val_items[user]), int(data.test_items[user]),
                       *data.val_negatives[user].tolist(),
                       *data.test_negatives[user].tolist()})
    assert items[offsets[user]:offsets[user + 1]].tolist() == expected


def test_scored_items_drop_a_candidate_given_twice():
  # Splits draw distinct candidates; data that repeats one (here user 0's
  # first test negative is also a validation negative) is still scored on
  # each item once.
  data = _data()
  test_negatives = data.test_negatives.copy()
  test_negatives[0, 0] = data.val_negatives[0, 0]
  data = dataclasses.replace(data, test_negatives=test_negatives)
  offsets, items = leave_one_out.LeaveOneOut(
      data, clients_per_round=6).run_data().scored_items
  for user in range(data.num_users):
    expected = sorted({int(data.val_items[user]), int(data.test_items[user]),
                       *data.val_negatives[user].tolist(),
                       *data.test_negatives[user].tolist()})
    assert items[offsets[user]:offsets[user + 1]].tolist() == expected
  assert offsets[1] == 2 * data.val_negatives.shape[1] + 1


def test_excluded_and_overselected_tiers_train_as_the_selection_says():
  data = _data()
  tiers = np.array([0, 1, 2, 0, 1, 2])
  excluded = leave_one_out.LeaveOneOut(
      data, clients_per_round=6, user_tiers=tiers,
      selection=client_selection.ExcludeTier(0))
  # Every user a round, but the low tier's.
  np.testing.assert_array_equal(excluded.round_input(0).users, [1, 2, 4, 5])
  overselected = leave_one_out.LeaveOneOut(
      data, clients_per_round=2, user_tiers=tiers,
      selection=client_selection.Overselect(0.5))
  for round_num in range(5):
    users = overselected.round_users(round_num)
    # 3 drawn, the extra one dropped from the slowest tier drawn.
    assert users.size == 2
    np.testing.assert_array_equal(
        users, overselected.round_input(round_num).users)


@pytest.mark.parametrize('pool', leave_one_out.NEGATIVE_POOLS)
def test_a_round_of_a_large_population_draws_only_its_users_examples(pool):
  data = _data(num_users=30, num_items=60, per_user=8)
  protocol = leave_one_out.LeaveOneOut(
      data, clients_per_round=7, negative_pool=pool, seed=2,
      negatives_per_positive=3, round_users_only=True)
  for round_num in range(3):
    round_input = protocol.round_input(round_num)
    users = round_input.users
    # The same users as the every-user draw: they are the round's first.
    np.testing.assert_array_equal(
        users, leave_one_out.LeaveOneOut(
            data, clients_per_round=7, negative_pool=pool, seed=2,
            round_users_only=False).round_users(round_num))
    examples = round_input.examples
    sizes = np.diff(examples.offsets)
    assert np.all(sizes[np.setdiff1d(np.arange(30), users)] == 0)
    for user, user_data in zip(users, round_input.user_data):
      train = data.train_items[data.train_offsets[user]:
                               data.train_offsets[user + 1]]
      if pool == 'never_interacted':
        excluded = data.interacted_items[data.interacted_offsets[user]:
                                         data.interacted_offsets[user + 1]]
      else:
        excluded = train
      items, labels = user_data['items'], user_data['labels']
      assert items.size == 4 * train.size == sizes[user]
      assert sorted(items[labels == 1].tolist()) == sorted(train.tolist())
      negatives = items[labels == 0]
      assert not np.isin(negatives, excluded).any()
      assert np.all((0 <= negatives) & (negatives < 60))


def test_large_populations_draw_round_users_only_by_default(monkeypatch):
  data = _data()
  assert not leave_one_out.LeaveOneOut(
      data, clients_per_round=3).round_users_only
  monkeypatch.setattr(leave_one_out, 'ROUND_USERS_ONLY_FROM', 6)
  assert leave_one_out.LeaveOneOut(data, clients_per_round=3).round_users_only
  # Every user a round: the every-user draw is the round's draw.
  assert not leave_one_out.LeaveOneOut(
      data, clients_per_round=6).round_users_only
