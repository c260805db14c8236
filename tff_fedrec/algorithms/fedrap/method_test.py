"""Tests of FedRAP's method: a real round through TFF against each user's
round computed alone (`local_training`), the server's C as the mean of the
users' copies, scores and the exported user model as
affine_u(D^(u)_j + C_j), and results independent of the grouping.

All computations run on one TFF worker owned by this module.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec.algorithms import method
from tff_fedrec.algorithms.fedrap import local_training
from tff_fedrec.algorithms.fedrap import method as fedrap
from tff_fedrec.algorithms.local_items import compact_tables
from tff_fedrec.programs import execution

_NUM_USERS, _NUM_ITEMS, _DIM = 4, 20, 3
_TRAINING = local_training.FedRAPTrainingConfig(
    learning_rate=0.5, item_learning_rate=2.0, batch_size=4, local_epochs=2,
    weight_decay=0.01,
)


@pytest.fixture(scope='module', autouse=True)
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


def _build():
  rng = np.random.default_rng(0)
  positives = [np.sort(rng.choice(_NUM_ITEMS, 2 + u, replace=False))
               for u in range(_NUM_USERS)]
  offsets = np.concatenate([[0], np.cumsum([p.size for p in positives])])
  data = method.RunData(_NUM_USERS, _NUM_ITEMS, offsets,
                        np.concatenate(positives))
  return fedrap.build_fedrap(data=data, seed=1, embedding_dim=_DIM,
                             training=_TRAINING), positives


def _round_input(round_num, positives):
  rng = np.random.default_rng(round_num + 10)
  user_data = []
  for user, items in enumerate(positives):
    negatives = rng.choice(np.setdiff1d(np.arange(_NUM_ITEMS), items),
                           2 * items.size, replace=False)
    user_data.append(collections.OrderedDict(
        items=np.concatenate([items, negatives]).astype(np.int32),
        labels=np.repeat([1.0, 0.0], [items.size, negatives.size]).astype(
            np.float32),
        seed=np.array([round_num, user], np.int64),
    ))
  return method.RoundInput(round_num, np.arange(_NUM_USERS), user_data,
                           None, 0)


def _alone(built, user_data):
  """One user's round 0 by `local_training` alone: its dense D^(u), its
  dense copy of C and its affine layer."""
  data = compact_tables.group_client_data([user_data])
  ids = data['row_ids'][0]
  d0 = built.initial_personal_table
  c0 = built.initial_parameters['item_embedding']
  layers = [collections.OrderedDict(
      (k, v[None]) for k, v in layer.items())
      for layer in built.initial_parameters['score_layers']]
  result = local_training.train_users_locally(
      tf.constant(d0[ids][None]), tf.constant(c0[ids][None]), layers,
      data['items'], data['labels'], data['num_examples'], round_num=0,
      shuffle_seeds=data['seeds'], config=_TRAINING,
  )
  scale = float(result.round_row_scale[0])
  personal, shared = d0 * scale, c0 * scale
  personal[ids] = result.personal_rows[0].numpy()
  shared[ids] = result.global_rows[0].numpy()
  layer = result.score_layers[0]
  return personal, shared, (layer['kernel'][0].numpy(),
                            layer['bias'][0].numpy())


def test_a_round_is_each_user_alone_and_the_mean_of_their_copies():
  built, positives = _build()
  store, state = built.initial_store(), built.process.initialize()
  round_input = _round_input(0, positives)
  result = built.run_round(state, store, round_input, users_per_client=3)
  alone = [_alone(built, data) for data in round_input.user_data]
  table = np.asarray(result.server_state['global_parameters'][
      'item_embedding'])
  np.testing.assert_allclose(table, np.mean([a[1] for a in alone], axis=0),
                             rtol=1e-5, atol=1e-5)
  candidates = np.tile(np.arange(_NUM_ITEMS), [_NUM_USERS, 1])
  scores = built.score(result.server_state, store, method.CandidateItems(
      np.arange(_NUM_USERS), candidates))
  for user, (personal, _, (kernel, bias)) in enumerate(alone):
    np.testing.assert_allclose(
        scores[user], (personal + table) @ kernel[:, 0] + bias[0],
        rtol=1e-4, atol=1e-4)
    model = built.on_device_user_model(result.server_state, store, user)
    np.testing.assert_allclose(model.params['item_embedding'],
                               personal + table, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(model.params['score_layers'][0]['kernel'],
                               kernel, rtol=1e-6)
  assert result.metrics['upload_bytes'] == _NUM_USERS * _NUM_ITEMS * _DIM * 4
  assert result.metrics['download_bytes'] == result.metrics['upload_bytes']


def test_two_rounds_do_not_depend_on_the_grouping():
  results = []
  for users_per_client in (1, 3):
    built, positives = _build()
    store, state = built.initial_store(), built.process.initialize()
    for round_num in range(2):
      state = built.run_round(state, store, _round_input(round_num, positives),
                              users_per_client=users_per_client).server_state
    results.append((
        np.asarray(state['global_parameters']['item_embedding']),
        built.score(state, store,
                    method.CandidateItems(np.arange(_NUM_USERS))),
    ))
  np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-4,
                             atol=1e-5)


def test_the_new_phone_model_is_the_initial_tables_sum():
  built, _ = _build()
  store, state = built.initial_store(), built.process.initialize()
  model = built.on_device_tier_model(state, store, 'single')
  np.testing.assert_allclose(
      model.params['item_embedding'],
      built.initial_parameters['item_embedding']
      + built.initial_personal_table)


def test_global_table_sparsity_counts_entries_near_zero():
  assert fedrap.global_table_sparsity(
      np.array([[0.0, 1e-5], [-2e-4, 3.0]])) == 0.5
