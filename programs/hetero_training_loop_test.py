import numpy as np
import pytest

from tff_fedrec import hetero_models
from tff_fedrec.algorithms import hetefedrec
from tff_fedrec.programs import hetero_training_loop
from tff_fedrec.tasks import preprocessing
from tff_fedrec.tasks import synthetic


def _config(**kwargs):
  return hetero_training_loop.HeteroLoopConfig(rounds=10, **kwargs)


def test_each_epoch_takes_every_user_once_in_slices_of_the_queue():
  config = _config(clients_per_round=4, seed=3)
  # 10 users, 4 per round: rounds 0-2 are epoch 0 (4 + 4 + 2 users).
  epoch0 = [hetero_training_loop.round_users(10, config, r) for r in range(3)]
  assert [len(u) for u in epoch0] == [4, 4, 2]
  np.testing.assert_array_equal(np.sort(np.concatenate(epoch0)), np.arange(10))
  epoch1 = [hetero_training_loop.round_users(10, config, r)
            for r in range(3, 6)]
  np.testing.assert_array_equal(np.sort(np.concatenate(epoch1)), np.arange(10))
  # The queue is reshuffled per epoch and fixed by (seed, round).
  assert any(not np.array_equal(a, b) for a, b in zip(epoch0, epoch1))
  np.testing.assert_array_equal(
      hetero_training_loop.round_users(10, config, 4), epoch1[1]
  )


def test_bytes_per_client_follow_table_iii():
  spec = hetero_models.HeteroSpec(num_items=10, widths=(2, 4, 8),
                                  hidden_units=(3,))
  config = hetefedrec.HeteroConfig(distillation_items=0)
  theta = lambda width: 4 * ((2 * width * 3 + 3) + (3 * 1 + 1))
  table = lambda width: 4 * 10 * width

  sent = hetero_training_loop.bytes_per_client(
      hetefedrec.build_hetefedrec(spec=spec, config=config)
  )
  # HeteFedRec: V_a plus Theta_b for every b <= a (UDL).
  assert sent['small']['download'] == table(2) + theta(2)
  assert sent['medium']['download'] == table(4) + theta(2) + theta(4)
  assert sent['large']['download'] == table(8) + theta(2) + theta(4) + theta(8)
  assert all(s['upload'] == s['download'] for s in sent.values())

  small = hetero_training_loop.bytes_per_client(
      hetefedrec.build_all_small(spec=spec, config=config)
  )
  assert all(s['download'] == table(2) + theta(2) for s in small.values())
  exclusive = hetero_training_loop.bytes_per_client(
      hetefedrec.build_all_large_exclusive(spec=spec, config=config)
  )
  assert exclusive['small']['upload'] == 0
  assert exclusive['small']['download'] == table(8) + theta(8)


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
  result = hetero_training_loop.popularity_metrics(data, (1, 1, 1), k=1)
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
  result = hetero_training_loop.popularity_metrics(data, (1, 1, 1), k=1)
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
  config = hetero_training_loop.HeteroLoopConfig(
      rounds=1, negatives_per_positive=4
  )
  negatives = {0: set(), 1: set()}
  for round_num in range(20):
    examples = hetero_training_loop.round_examples(
        data, config, round_num, np.array([0, 1])
    )
    for position in (0, 1):
      items, labels = preprocessing.user_examples(examples, position)
      negatives[position] |= set(items[labels == 0].tolist())
  assert negatives[0] == {2, 3}
  assert negatives[1] == {0, 1, 2}


def _segments(examples, users):
  return {
      user: tuple(np.concatenate(preprocessing.user_examples(examples, p)))
      for p, user in enumerate(users)
  }


def test_negatives_drawn_once_are_each_users_own_in_every_round(tmp_path):
  data = preprocessing.random_split(
      preprocessing.index_interactions(synthetic.generate_interactions(
          num_users=12, num_items=40, seed=1)),
      seed=0,
  )
  method = hetefedrec.build_hetefedrec(
      spec=hetero_models.HeteroSpec(num_items=data.num_items,
                                    widths=(2, 3, 4), hidden_units=(3,)))

  def examples(training_negatives, round_num, users, run_dir='run'):
    run = hetero_training_loop.HeteroTrainingRun(
        method, data, _config(training_negatives=training_negatives),
        str(tmp_path / run_dir), log=lambda _: None,
    )
    return _segments(run.round_examples(round_num, users), users)

  first = examples('once', 0, np.array([1, 4, 7]))
  # Another round, other users beside it, another run of the same seed.
  later = examples('once', 5, np.array([0, 4, 9]), run_dir='other')
  assert later[4] == first[4]
  redrawn = examples('per_round', 5, np.array([0, 4, 9]))
  assert redrawn[4] != examples('per_round', 0, np.array([1, 4, 7]))[4]
  # Each user's positives with 4 negatives each, either way.
  assert len(first[4]) == len(redrawn[4])


def test_an_unknown_negatives_schedule_is_refused():
  with pytest.raises(ValueError, match='training_negatives must be one of'):
    _config(training_negatives='per_epoch')


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

  result = hetero_training_loop.tiered_ranking_metrics(
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
        hetero_training_loop.tied_rows(scores, exclude, batch), want)


def test_held_out_examples_take_a_tenth_rounded_up_but_never_everything():
  rng = np.random.default_rng(0)
  masks = hetero_training_loop.held_out_examples([80, 9, 1, 5], 0.1, rng)
  assert [int(m.sum()) for m in masks] == [8, 1, 0, 1]
  assert [m.size for m in masks] == [80, 9, 1, 5]
  # The draw is random: two rounds hold out different examples.
  again = hetero_training_loop.held_out_examples([80], 0.1, rng)
  assert not np.array_equal(again[0], masks[0])
  assert all(not m.any() for m in hetero_training_loop.held_out_examples(
      [80, 9], 0.0, rng))
