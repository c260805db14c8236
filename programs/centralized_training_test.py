import numpy as np
import pytest

from tff_fedrec.programs import centralized_training
from tff_fedrec.tasks import preprocessing
from tff_fedrec.tasks import random_split


def _two_taste_data(num_users=60, items_per_taste=8, seed=0):
  """Users 0, 2, 4, ... like items 0-7, users 1, 3, ... items 8-15. Each
  user trains on 6 of its taste's items and tests on the other 2; every
  item is about equally popular, so popularity cannot tell the tastes
  apart."""
  rng = np.random.default_rng(seed)
  train, test = [], []
  for user in range(num_users):
    base = (user % 2) * items_per_taste
    chosen = base + rng.permutation(items_per_taste)[:8]
    train.append(np.sort(chosen[:6]))
    test.append(np.sort(chosen[6:]))
  offsets = lambda rows: np.concatenate(
      [[0], np.cumsum([len(r) for r in rows])]
  ).astype(np.int64)
  interacted = [np.sort(np.concatenate([a, b])) for a, b in zip(train, test)]
  return preprocessing.RandomSplitData(
      num_users=num_users, num_items=2 * items_per_taste,
      user_ids=np.arange(num_users), item_ids=np.arange(2 * items_per_taste),
      train_offsets=offsets(train),
      train_items=np.concatenate(train).astype(np.int32),
      test_offsets=offsets(test),
      test_items=np.concatenate(test).astype(np.int32),
      interacted_offsets=offsets(interacted),
      interacted_items=np.concatenate(interacted).astype(np.int32),
  )


def test_centralised_training_learns_tastes_that_popularity_cannot_see():
  data = _two_taste_data()
  tiers = np.zeros(data.num_users, np.int32)
  tiers[30:] = 2
  tiers[18:30] = 1
  popularity = random_split.popularity_metrics(data, tiers, k=2)
  history = centralized_training.train_centralized(
      data, epochs=40, width=8, hidden_units=(8,), learning_rate=0.05,
      batch_size=64, init_scale=0.1, k=2, log=lambda _: None,
      user_tiers=tiers,
  )
  assert [h['epoch'] for h in history] == list(range(1, 41))
  assert history[-1]['loss'] < history[0]['loss']
  # A user's 10 unseen items are its 2 test items and the other taste's 8.
  # A model that learned the tastes ranks the test items first; a
  # taste-blind ranking finds about 2 / 10 of them.
  assert popularity['recall@2'] < 0.35
  assert history[-1]['recall@2'] > 0.6
  assert history[-1]['recall@2'] > popularity['recall@2'] + 0.3
  assert set(history[-1]['per_tier']) == {'small', 'medium', 'large'}


def test_the_same_seed_gives_the_same_history():
  data = _two_taste_data(num_users=20)
  run = lambda: centralized_training.train_centralized(
      data, epochs=2, width=4, hidden_units=(4,), k=2, log=lambda _: None,
      user_tiers=np.zeros(data.num_users, np.int32),
  )
  first, second = run(), run()
  assert [h['ndcg@2'] for h in first] == [h['ndcg@2'] for h in second]
  assert [h['loss'] for h in first] == [h['loss'] for h in second]


@pytest.mark.parametrize('flags', [dict(epochs=0), dict(epochs=1, width=0)])
def test_non_positive_sizes_are_refused(flags):
  with pytest.raises(ValueError, match='must be positive'):
    centralized_training.train_centralized(
        _two_taste_data(num_users=4), user_tiers=np.zeros(4, np.int32),
        **flags)
