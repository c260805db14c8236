"""Tests of `LocalItemMethod`'s scores: which item table scores the rows a
user did not fine-tune, against a numpy reading of PFedRec's reference
evaluation.

The reference code keeps, per user, the whole model it trained in its last
round (`client_model_params[user]`): the item table broadcast at that
round's start with the user's fine-tuned rows written over it, and its own
score function. These tests run real rounds (partial participation, so that
users last started from different tables), then score every item of every
user by hand from that description and compare.

All computations run on one TFF worker owned by this module.
"""

import collections
import dataclasses

import numpy as np
import pytest

from tff_fedrec.algorithms import method
from tff_fedrec.algorithms import pfedrec
from tff_fedrec.algorithms.fedras import exchange as fedras_exchange
from tff_fedrec.algorithms.local_items import client_training
from tff_fedrec.programs import execution

_NUM_USERS = 4
_NUM_ITEMS = 24
_DIM = 4
_TRAINING = client_training.ClientTrainingConfig(
    learning_rate=0.5, item_learning_rate=5.0, batch_size=8,
)


@pytest.fixture(scope='module', autouse=True)
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


def _run_data():
  rng = np.random.default_rng(0)
  items = [np.sort(rng.choice(_NUM_ITEMS, 5, replace=False))
           for _ in range(_NUM_USERS)]
  offsets = np.concatenate([[0], np.cumsum([len(i) for i in items])])
  return method.RunData(_NUM_USERS, _NUM_ITEMS, offsets,
                        np.concatenate(items)), items


def _round_input(round_num, users, items):
  rng = np.random.default_rng(round_num + 1)
  user_data = []
  for user in users:
    negatives = rng.choice(
        np.setdiff1d(np.arange(_NUM_ITEMS), items[user]), 5, replace=False)
    user_data.append(collections.OrderedDict(
        items=np.concatenate([items[user], negatives]).astype(np.int32),
        labels=np.repeat([1.0, 0.0], 5).astype(np.float32),
        seed=np.array([round_num, user], np.int64),
    ))
  return method.RoundInput(round_num=round_num, users=np.asarray(users),
                           user_data=user_data, examples=None, seed=0)


def _train(built, rounds, items):
  """Runs `rounds` (lists of users); returns the store, the final state and
  the global item table at the start of every round and after the last."""
  store = built.initial_store()
  state = built.process.initialize()
  tables = []
  for round_num, users in enumerate(rounds):
    tables.append(np.array(built.global_parameters(state)['item_embedding']))
    state = built.run_round(
        state, store, _round_input(round_num, users, items)
    ).server_state
  tables.append(np.array(built.global_parameters(state)['item_embedding']))
  return store, state, tables


def _reference_scores(store, start_tables):
  """Scores [U, N] of every item: user u's fine-tuned rows over
  start_tables[u], through its own one-layer score function."""
  scores = []
  for user in range(_NUM_USERS):
    state = store.get([user])[0]
    table = np.array(start_tables[user], np.float64)
    table[state['personal_item_ids']] = state['personal_item_rows']
    layer = state['local_parameters']['score_layers'][0]
    scores.append((table @ layer['kernel'] + layer['bias'])[:, 0])
  return np.stack(scores)


def _all_items():
  return np.tile(np.arange(_NUM_ITEMS), (_NUM_USERS, 1))


# Round 0: users 0, 1, 2; round 1: users 0 and 3. User 1 and 2 last started
# from round 0's table, users 0 and 3 from round 1's.
_ROUNDS = [[0, 1, 2], [0, 3]]
_LAST_START = {0: 1, 1: 0, 2: 0, 3: 1}


def test_untrained_rows_are_scored_with_the_table_the_user_started_from():
  data, items = _run_data()
  built = pfedrec.build_pfedrec(data=data, seed=0, embedding_dim=_DIM,
                                training=_TRAINING)
  store, state, tables = _train(built, _ROUNDS, items)

  got = built.score(state, store, method.CandidateItems(
      np.arange(_NUM_USERS), _all_items()))

  expected = _reference_scores(
      store, [tables[_LAST_START[u]] for u in range(_NUM_USERS)])
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  # The same users scored with the latest table differ: the test can tell.
  latest = _reference_scores(store, [tables[-1]] * _NUM_USERS)
  assert np.abs(latest - expected).max() > 1e-3
  # And a user's exported model scores as it is evaluated.
  model = built.on_device_user_model(state, store, 2)
  table = np.array(tables[0])
  personal = store.get([2])[0]
  table[personal['personal_item_ids']] = personal['personal_item_rows']
  np.testing.assert_allclose(model.params['item_embedding'], table)


def test_the_aggregated_option_scores_untrained_rows_with_the_latest_table():
  data, items = _run_data()
  built = pfedrec.build_pfedrec(
      data=data, seed=0, embedding_dim=_DIM,
      training=dataclasses.replace(_TRAINING,
                                   untrained_item_rows='aggregated'),
  )
  store, state, tables = _train(built, _ROUNDS, items)

  got = built.score(state, store, method.CandidateItems(
      np.arange(_NUM_USERS), _all_items()))

  np.testing.assert_allclose(
      got, _reference_scores(store, [tables[-1]] * _NUM_USERS),
      rtol=1e-5, atol=1e-5)
  assert store.num_start_tables == 0


def test_under_a_compressed_exchange_the_user_s_own_copy_is_its_start_table():
  data, items = _run_data()
  built = pfedrec.build_pfedrec(
      data=data, seed=0, embedding_dim=_DIM, training=_TRAINING,
      exchange=fedras_exchange.FedRASOptions(compression_rate=0.5),
  )
  store, state, tables = _train(built, _ROUNDS, items)
  copies = store.stacked_local_parameters(
      np.arange(_NUM_USERS))['item_copy']

  got = built.score(state, store, method.CandidateItems(
      np.arange(_NUM_USERS), _all_items()))

  np.testing.assert_allclose(got, _reference_scores(store, copies),
                             rtol=1e-5, atol=1e-5)
  # A user's copy is not the server's table (the downlink is compressed).
  assert np.abs(copies[0] - tables[-1]).max() > 1e-4
  assert store.num_start_tables == 0


def test_unknown_untrained_item_rows_is_refused():
  with pytest.raises(ValueError, match='untrained_item_rows must be one of'):
    client_training.ClientTrainingConfig(untrained_item_rows='latest')

