"""Tests of the batched leave-one-out evaluation of every user's own model."""

import collections

import numpy as np
import pytest

from tff_fedrec import metrics
from tff_fedrec import models
from tff_fedrec.algorithms.local_items import item_scoring
from tff_fedrec.algorithms.local_items import personal_rows

_NUM_ITEMS = 6
_DIM = 3
_NUM_USERS = 5


def _numpy_mlp(inputs, layers):
  hidden = inputs
  for index, layer in enumerate(layers):
    hidden = hidden @ layer['kernel'] + layer['bias']
    if index < len(layers) - 1:
      hidden = np.maximum(hidden, 0.0)
  return hidden[:, 0]


def _store_with_random_states(spec, params, personal_users):
  """Every user gets its own local parameters; `personal_users` also get
  personal rows for items 0, 2 and 5. Returns (store, states)."""
  _, local_init = models.split_parameters(spec, params)
  store = personal_rows.PersonalRowsStore(
      _NUM_USERS,
      collections.OrderedDict(
          local_parameters=local_init,
          personal_item_ids=np.zeros([0], np.int32),
          personal_item_rows=np.zeros([0, _DIM], np.float32),
      ),
  )
  states = []
  for user in range(_NUM_USERS):
    _, local = models.split_parameters(
        spec, models.initial_parameters(spec, seed=100 + user)
    )
    ids = np.array([5, 0, 2] if user in personal_users else [], np.int32)
    rows = np.random.default_rng(user).normal(size=(len(ids), _DIM))
    states.append(
        collections.OrderedDict(
            local_parameters=local,
            personal_item_ids=ids,
            personal_item_rows=rows.astype(np.float32),
        )
    )
  store.put(range(_NUM_USERS), states)
  return store, states


def _user_item_vectors(state, item_embedding, items):
  """One user's view of the item table, built row by row."""
  table = item_embedding.copy()
  for item, row in zip(state['personal_item_ids'], state['personal_item_rows']):
    table[item] = row
  return table[items]


_CANDIDATES = np.array([
    [0, 1, 2, 5],
    [5, 5, 3, 0],
    [4, 2, 1, 0],
    [2, 3, 4, 5],
    [1, 0, 5, 4],
])


@pytest.mark.parametrize('user_batch_size', [2, 1024])
def test_score_candidates_score_function_with_personal_rows(user_batch_size):
  spec = models.RecommenderSpec('score_function', _NUM_ITEMS, _DIM, (4,))
  params = models.initial_parameters(spec, seed=0)
  global_params, _ = models.split_parameters(spec, params)
  store, states = _store_with_random_states(spec, params, personal_users={1, 4})

  got = item_scoring.score_candidates(
      spec, global_params, store, _CANDIDATES, user_batch_size=user_batch_size
  )

  # Each user's model: its own score layers on its own view of the items.
  expected = np.stack([
      _numpy_mlp(
          _user_item_vectors(state, params['item_embedding'], candidates),
          state['local_parameters']['score_layers'],
      )
      for state, candidates in zip(states, _CANDIDATES)
  ])
  assert got.shape == _CANDIDATES.shape
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('user_batch_size', [2, 1024])
def test_score_candidates_neural_cf_with_shared_mlp(user_batch_size):
  spec = models.RecommenderSpec(
      'neural_cf', _NUM_ITEMS, _DIM, (4,), personal_score_layers=False
  )
  params = models.initial_parameters(spec, seed=1)
  global_params, _ = models.split_parameters(spec, params)
  store, states = _store_with_random_states(spec, params, personal_users={0})

  got = item_scoring.score_candidates(
      spec, global_params, store, _CANDIDATES, user_batch_size=user_batch_size
  )

  # Shared MLP on [p_u ; q_j] with each user's own p_u.
  expected = []
  for state, candidates in zip(states, _CANDIDATES):
    q = _user_item_vectors(state, params['item_embedding'], candidates)
    p = np.tile(state['local_parameters']['user_embedding'], (len(q), 1))
    expected.append(
        _numpy_mlp(np.concatenate([p, q], axis=1), params['score_layers'])
    )
  np.testing.assert_allclose(got, np.stack(expected), rtol=1e-5, atol=1e-6)


def test_leave_one_out_scores_rank_positives_at_known_positions():
  # MF with d = 1: item i has the 1-d vector [i], so user u scores item i
  # with p_u * i (or p_u * row for its personal rows).
  num_items = 30
  spec = models.RecommenderSpec('matrix_factorization', num_items, 1)
  global_params = collections.OrderedDict(
      item_embedding=np.arange(num_items, dtype=np.float32)[:, None]
  )
  store = personal_rows.PersonalRowsStore(
      3,
      collections.OrderedDict(
          local_parameters=collections.OrderedDict(
              user_embedding=np.zeros([1], np.float32)
          ),
          personal_item_ids=np.zeros([0], np.int32),
          personal_item_rows=np.zeros([0, 1], np.float32),
      ),
  )
  def state(p, ids=(), rows=()):
    return collections.OrderedDict(
        local_parameters=collections.OrderedDict(
            user_embedding=np.array([p], np.float32)
        ),
        personal_item_ids=np.array(ids, np.int32),
        personal_item_rows=np.array(rows, np.float32).reshape([-1, 1]),
    )
  # User 2 ranks by -i, and its personal row makes item 0 score -100.
  store.put([0, 1, 2], [state(1.0), state(1.0), state(-1.0, [0], [[100.0]])])
  positives = np.array([29, 10, 20])
  negatives = np.array([
      list(range(0, 12)),
      [0, 1, 2, 3, 4, 11, 12, 13, 14, 15, 16, 17],
      [21, 22, 23, 24, 25, 26, 0, 1, 2, 3, 4, 5],
  ])

  got = metrics.summarize_sampled(item_scoring.score_candidates(
      spec, global_params, store,
      np.concatenate([positives[:, None], negatives], axis=1)))

  # User 0: 29 beats 0..11                       -> rank 1, AUC 12/12.
  # User 1: 10 beats 0..4, loses to 11..17       -> rank 8, AUC 5/12.
  # User 2: -20 beats -21..-26 and -100 (item 0 via its personal row),
  #         loses to -1..-5                      -> rank 6, AUC 7/12.
  # (Without the personal row, item 0 would score 0 and the rank be 7.)
  ranks = np.array([1, 8, 6])
  assert got['hr@5'] == pytest.approx(1 / 3)
  assert got['hr@10'] == pytest.approx(1.0)
  assert got['ndcg@5'] == pytest.approx(1 / 3)
  assert got['ndcg@10'] == pytest.approx(np.mean(1 / np.log2(ranks + 1)))
  assert got['auc'] == pytest.approx((12 / 12 + 5 / 12 + 7 / 12) / 3)
