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


def _round_input(round_num, users, items, last_round_users=None):
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
                           user_data=user_data, examples=None, seed=0,
                           last_round_users=last_round_users)


def _train(built, rounds, items, last_round_users=None, on_round=None):
  """Runs `rounds` (lists of users; `last_round_users` a bool list per
  round, or None) and calls `on_round(store, state)` after each; returns
  the store, the final state and the global item table at the start of
  every round and after the last."""
  store = built.initial_store()
  state = built.process.initialize()
  tables = []
  for round_num, users in enumerate(rounds):
    tables.append(np.array(built.global_parameters(state)['item_embedding']))
    state = built.run_round(
        state, store, _round_input(
            round_num, users, items,
            None if last_round_users is None
            else np.array(last_round_users[round_num]))
    ).server_state
    if on_round is not None:
      on_round(store, state)
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



def _scored_items(seed=3, per_user=8):
  """CSR of `per_user` random items per user, ascending."""
  rng = np.random.default_rng(seed)
  items = [np.sort(rng.choice(_NUM_ITEMS, per_user, replace=False))
           for _ in range(_NUM_USERS)]
  return (np.arange(_NUM_USERS + 1) * per_user, np.concatenate(items)), items


def test_between_its_rounds_a_user_keeps_only_the_rows_it_is_scored_by():
  """A run of three rounds stopped after two, as a killed run: users 1
  and 2 train again in round 2, so after round 1 they hold only their
  fine-tuned rows of the items the protocol scores; 0 and 3 (round 1 is
  their last) hold all of theirs. Scores of the scored items are those of
  a run that keeps every row, bit for bit, after every round."""
  data, items = _run_data()
  scored, scored_per_user = _scored_items()
  kept_all = pfedrec.build_pfedrec(data=data, seed=0, embedding_dim=_DIM,
                                   training=_TRAINING)
  kept_scored = pfedrec.build_pfedrec(
      data=dataclasses.replace(data, scored_items=scored), seed=0,
      embedding_dim=_DIM, training=_TRAINING)
  candidates = np.stack(scored_per_user)
  examples = method.CandidateItems(np.arange(_NUM_USERS), candidates)
  scores = {id(kept_all): [], id(kept_scored): []}

  def recorder(built):
    return lambda store, state: scores[id(built)].append(
        built.score(state, store, examples))

  full_store, full_state, _ = _train(kept_all, _ROUNDS, items,
                                     on_round=recorder(kept_all))
  store, state, _ = _train(
      kept_scored, _ROUNDS, items,
      last_round_users=[[False, False, False], [True, True]],
      on_round=recorder(kept_scored))

  for got, expected in zip(scores[id(kept_scored)], scores[id(kept_all)]):
    np.testing.assert_array_equal(got, expected)
  np.testing.assert_array_equal(store.has_whole_rows(range(_NUM_USERS)),
                                [True, False, False, True])
  for user in range(_NUM_USERS):
    everything = full_store.get([user])[0]
    mine = store.get([user])[0]
    wanted = (np.ones(everything['personal_item_ids'].shape, bool)
              if user in (0, 3) else
              np.isin(everything['personal_item_ids'],
                      scored_per_user[user]))
    np.testing.assert_array_equal(mine['personal_item_ids'],
                                  everything['personal_item_ids'][wanted])
    np.testing.assert_array_equal(mine['personal_item_rows'],
                                  everything['personal_item_rows'][wanted])
  # Users 1 and 2 trained items outside their scored ones: rows were left.
  assert sum(store.get([u])[0]['personal_item_ids'].size for u in (1, 2)) < (
      sum(full_store.get([u])[0]['personal_item_ids'].size for u in (1, 2)))
  # A phone's model needs every row: user 0's is the full run's, user 1's
  # is refused with the fix.
  np.testing.assert_array_equal(
      kept_scored.on_device_user_model(state, store, 0).params[
          'item_embedding'],
      kept_all.on_device_user_model(full_state, full_store, 0).params[
          'item_embedding'])
  with pytest.raises(ValueError, match='Train the run to its last round'):
    kept_scored.on_device_user_model(state, store, 1)
  # The marks survive a checkpoint.
  restored = kept_scored.initial_store()
  restored.load_arrays(store.to_arrays())
  np.testing.assert_array_equal(restored.has_whole_rows(range(_NUM_USERS)),
                                [True, False, False, True])


def test_without_last_round_marks_every_user_keeps_all_its_rows():
  data, items = _run_data()
  scored, _ = _scored_items()
  built = pfedrec.build_pfedrec(
      data=dataclasses.replace(data, scored_items=scored), seed=0,
      embedding_dim=_DIM, training=_TRAINING)
  reference = pfedrec.build_pfedrec(data=data, seed=0, embedding_dim=_DIM,
                                    training=_TRAINING)
  store, _, _ = _train(built, _ROUNDS, items)
  full_store, _, _ = _train(reference, _ROUNDS, items)
  assert store.has_whole_rows(range(_NUM_USERS)).all()
  for user in range(_NUM_USERS):
    np.testing.assert_array_equal(
        store.get([user])[0]['personal_item_ids'],
        full_store.get([user])[0]['personal_item_ids'])
