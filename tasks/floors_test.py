"""The floors on a planted leak: under the papers' leave-one-out pool the
memorizer passes chance, under the leak-free pool it does not; the
popularity ranking and chance against hand computations."""

import numpy as np
import pandas as pd
import pytest

from tff_fedrec import metrics
from tff_fedrec.tasks import floors
from tff_fedrec.tasks import leave_one_out
from tff_fedrec.tasks import preprocessing
from tff_fedrec.tasks import random_split
from tff_fedrec.tasks import synthetic


def _leave_one_out(pool, num_users=40, num_items=150, per_user=8):
  rng = np.random.default_rng(3)
  rows = [(f'u{u}', f'i{item}', 5.0, float(k))
          for u in range(num_users)
          for k, item in enumerate(rng.choice(num_items, per_user,
                                              replace=False))]
  data = preprocessing.leave_one_out_split(
      preprocessing.index_interactions(pd.DataFrame(
          rows, columns=['user', 'item', 'rating', 'timestamp'])),
      num_eval_negatives=49, seed=0)
  return leave_one_out.LeaveOneOut(
      data, clients_per_round=num_users, negative_pool=pool, seed=0)


@pytest.mark.parametrize('pool, leaks', [('never_interacted', True),
                                         ('outside_training', False)])
def test_the_memorizer_passes_chance_only_where_the_pool_leaks(pool, leaks):
  protocol = _leave_one_out(pool)
  result = floors.floors(protocol, rounds=30)
  memorizer = result['memorizer']['hr@10']
  assert result['chance'] == {'hr@10': 10 / 50}
  if leaks:
    # Every test negative was a training negative, the test item never.
    assert memorizer == 1.0
    assert any('rewards remembering' in w for w in floors.warnings(result))
  else:
    assert memorizer < floors.CHANCE_FACTOR * 0.2
    assert not any('rewards remembering' in w
                   for w in floors.warnings(result))
  lines = floors.lines(result)
  assert lines[0] == f'memorizer HR@10 {memorizer:.4f}'
  assert lines[1].startswith('popularity HR@10 ')
  assert lines[2] == 'chance HR@10 0.2000'
  assert all(line.startswith('WARNING: ') for line in lines[3:])


def test_the_memorizer_is_one_bce_step_a_round_on_its_own_examples():
  protocol = _leave_one_out('never_interacted')
  scores = floors.memorizer_scores(protocol, rounds=2)
  expected = np.random.default_rng(0).uniform(
      0.0, 1e-3, scores.shape).astype(np.float32)
  for round_num in range(2):
    round_input = protocol.round_input(round_num)
    step = np.zeros_like(expected)
    for user, data in zip(round_input.users, round_input.user_data):
      for item, label in zip(data['items'], data['labels']):
        step[user, item] -= 1.0 / (1.0 + np.exp(-expected[user, item])) - label
    expected += step
  np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)


def test_popularity_ranks_every_users_candidates_by_training_counts():
  protocol = _leave_one_out('never_interacted')
  data = protocol.data
  counts = np.bincount(data.train_items, minlength=data.num_items)
  candidates = np.concatenate([data.test_items[:, None],
                               data.test_negatives], axis=1)
  expected = metrics.summarize_sampled(counts[candidates].astype(float))
  result = floors.floors(protocol, rounds=1)['popularity']
  assert result['hr@10'] == pytest.approx(expected['hr@10'])
  assert result['ndcg@10'] == pytest.approx(expected['ndcg@10'])


def test_random_split_chance_is_k_over_each_users_unranked_items():
  data = preprocessing.random_split(
      preprocessing.index_interactions(synthetic.generate_interactions(
          num_users=12, num_items=40, seed=1)), seed=0)
  protocol = random_split.RandomSplit(
      data, user_tiers=np.zeros(data.num_users, np.int32))
  unranked = data.num_items - np.diff(data.train_offsets)
  has_test = np.diff(data.test_offsets) > 0
  assert protocol.chance() == {'recall@20': pytest.approx(
      np.mean(np.minimum(20 / unranked[has_test], 1.0)))}
  result = floors.floors(protocol, rounds=3)
  assert set(result) == {'metric', 'rounds', 'memorizer', 'popularity',
                         'chance'}
  assert result['metric'] == 'recall@20'


def test_a_memorizer_over_a_sample_remembers_those_users_as_over_all(
    monkeypatch):
  protocol = _leave_one_out('never_interacted')
  every_user = floors.memorizer_scores(protocol, rounds=3)
  # The noise rows are drawn in user order, so the first 10 users' scores
  # are those of the memorizer over every user, to the bit: a sample
  # changes whom it remembers, not what.
  np.testing.assert_array_equal(
      floors.memorizer_scores(protocol, rounds=3, users=np.arange(10)),
      every_user[:10])
  # Past the bound it remembers as many users as fit, a seeded sample.
  items = protocol.data.num_items
  monkeypatch.setattr(floors, 'MEMORIZER_MAX_SCORES', items * 12)
  sample = floors.memorizer_users(40, items)
  assert sample.size == 12 and np.all(np.diff(sample) > 0)
  np.testing.assert_array_equal(sample, floors.memorizer_users(40, items))
  result = floors.floors(protocol, rounds=30)
  assert result['memorizer_users'] == 12
  # The planted leak shows on the sample as on every user.
  assert result['memorizer']['hr@10'] == 1.0
