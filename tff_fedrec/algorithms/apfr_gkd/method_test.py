"""APFR-GKD's two readings of Algorithm 1 against a replay written out.

The replay below holds every client's model as a dense numpy table and
trains it with plain eager TF on dense variables (no `models`, `scoring`
or `local_sgd`), from the description of each reading:

  own_model  a client starts from its own model (theta_0 until it first
             trains; then every row it ever trained, theta_0's rows for
             the others, its own score MLP), trains on BCE + mu tau^2
             KL(teacher || student) with the teacher the buffer's average
             and its own p_i from before the phase; it uploads its change,
             and the global model becomes the mean over all N users of
             their models (a user outside the round changed nothing);
  download   a client starts from the global model; a user never selected
             is scored with the global model and its initial p_i.

Rounds: users 0 and 1 train in round 0, user 0 alone in round 1 (on other
items, some shared), user 2 never: rows merged across rounds, rows never
trained, a stale client and a client never selected all appear.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec.algorithms import method
from tff_fedrec.algorithms.apfr_gkd import client_round
from tff_fedrec.algorithms.apfr_gkd import method as apfr_gkd
from tff_fedrec.algorithms.local_items import client_training
from tff_fedrec.programs import execution

_NUM_USERS, _NUM_ITEMS, _DIM, _HIDDEN = 3, 12, 4, 3
_LEARNING_RATE, _ITEM_LEARNING_RATE, _USER_LEARNING_RATE = 0.4, 3.0, 1.5
_MU, _TAU, _BUFFER = 0.8, 2.0, 2
# Round -> user -> (items, labels); one batch each (batch size 16).
_ROUNDS = [
    {0: ([1, 3, 5, 7, 9], [1, 1, 0, 0, 0]),
     1: ([0, 3, 6, 8], [1, 0, 0, 1])},
    {0: ([3, 4, 10, 11, 2], [1, 0, 1, 0, 0])},
]


@pytest.fixture(scope='module', autouse=True)
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


def _build(client_start, **options):
  offsets = np.array([0, 2, 4, 5])
  data = method.RunData(_NUM_USERS, _NUM_ITEMS, offsets,
                        np.array([1, 3, 0, 8, 4]))
  training = client_training.ClientTrainingConfig(
      learning_rate=_LEARNING_RATE, item_learning_rate=_ITEM_LEARNING_RATE,
      user_learning_rate=_USER_LEARNING_RATE, batch_size=16, local_epochs=1,
      dual_personalization=False,
  )
  return apfr_gkd.build_apfr_gkd(
      data=data, seed=3, embedding_dim=_DIM, hidden_units=(_HIDDEN,),
      training=training, client_start=client_start,
      distillation=client_round.DistillationOptions(
          weight=_MU, temperature=_TAU),
      personalization='unary', buffer_size=_BUFFER, **options)


def _round_input(round_num):
  users = sorted(_ROUNDS[round_num])
  user_data = [collections.OrderedDict(
      items=np.array(_ROUNDS[round_num][u][0], np.int32),
      labels=np.array(_ROUNDS[round_num][u][1], np.float32),
      seed=np.array([round_num, u], np.int64)) for u in users]
  return method.RoundInput(round_num, np.array(users), user_data, None, 0)


def _train(built):
  store, state = built.initial_store(), built.process.initialize()
  for round_num in range(len(_ROUNDS)):
    state = built.run_round(state, store, _round_input(round_num),
                            users_per_client=2).server_state
  return store, state


def _logits(model, user_vector, items):
  """NCF: [p; q_j] -> Dense(ReLU) -> Dense(1)."""
  q = tf.gather(model['table'], items)
  hidden = tf.concat(
      [tf.tile(user_vector[None], [len(items), 1]), q], axis=1)
  (w1, b1), (w2, b2) = model['layers']
  return (tf.nn.relu(hidden @ w1 + b1) @ w2 + b2)[:, 0]


def _sgd(model, user_vector, items, labels, teacher_logits):
  """One batch: mean BCE + mu tau^2 mean two-class KL, one joint step."""
  variables = dict(
      table=tf.Variable(model['table']), user=tf.Variable(user_vector),
      layers=[(tf.Variable(w), tf.Variable(b)) for w, b in model['layers']])
  items = tf.constant(items, tf.int32)
  labels = tf.constant(labels, tf.float32)
  with tf.GradientTape() as tape:
    logits = _logits(dict(table=variables['table'],
                          layers=variables['layers']), variables['user'],
                     items)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=labels, logits=logits))
    if teacher_logits is not None:
      p = tf.sigmoid(teacher_logits / _TAU)
      q = tf.sigmoid(logits / _TAU)
      kl = p * tf.math.log(p / q) + (1 - p) * tf.math.log((1 - p) / (1 - q))
      loss += _MU * _TAU**2 * tf.reduce_mean(kl)
  flat_layers = [v for layer in variables['layers'] for v in layer]
  grads = tape.gradient(loss, [variables['table'], variables['user'],
                               *flat_layers])
  table = model['table'] - _ITEM_LEARNING_RATE * tf.convert_to_tensor(
      grads[0]).numpy()
  user = user_vector - _USER_LEARNING_RATE * grads[1].numpy()
  new_flat = [v.numpy() - _LEARNING_RATE * g.numpy()
              for v, g in zip(flat_layers, grads[2:])]
  layers = [(new_flat[0], new_flat[1]), (new_flat[2], new_flat[3])]
  return dict(table=table, layers=layers), user


def _as_model(params):
  return dict(table=np.array(params['item_embedding']),
              layers=[(np.array(l['kernel']), np.array(l['bias']))
                      for l in params['score_layers']])


def _mean_model(models):
  return dict(
      table=np.mean([m['table'] for m in models], axis=0),
      layers=[tuple(np.mean([m['layers'][i][j] for m in models], axis=0)
                    for j in range(2)) for i in range(2)])


def _replay_own_model(initial):
  """The own_model reading, written out (module docstring)."""
  theta_0 = _as_model(initial)
  users = [np.array(initial['user_embedding']) for _ in range(_NUM_USERS)]
  own = [theta_0] * _NUM_USERS
  aggregate, buffer = theta_0, []
  trained_rows = [set() for _ in range(_NUM_USERS)]
  for round_users in _ROUNDS:
    teacher = _mean_model(buffer) if buffer else None
    changes = []
    for user, (items, labels) in sorted(round_users.items()):
      teacher_logits = (None if teacher is None else
                        _logits(teacher, users[user], items))
      start = own[user]
      own[user], users[user] = _sgd(start, users[user], items, labels,
                                    teacher_logits)
      trained_rows[user] |= set(items)
      changes.append(tf.nest.map_structure(np.subtract, own[user], start))
    # Sum of the round's changes over the population of N users.
    aggregate = tf.nest.map_structure(
        lambda a, *c: a + np.sum(c, axis=0) / _NUM_USERS, aggregate,
        *changes)
    buffer = (buffer + [aggregate])[-_BUFFER:]
  return own, users, _mean_model(buffer), trained_rows, aggregate


def test_own_model_matches_the_replay():
  built = _build('own_model')
  store, state = _train(built)
  own, users, teacher, trained_rows, aggregate = _replay_own_model(
      built.initial_parameters)

  # The server: the latest aggregate is the mean of the client models
  # (replayed as sums of changes over N), the teacher the buffer's mean.
  served = _as_model(state['finalizer']['teacher'])
  np.testing.assert_allclose(served['table'], teacher['table'], atol=2e-5)
  np.testing.assert_allclose(
      np.array(state['global_parameters']['item_embedding']),
      aggregate['table'], atol=2e-5)
  # That is the mean of the three users' models (user 2's is theta_0):
  # user 0 alone in round 1 moved it by a third of its change.
  mean_of_models = _mean_model(own)
  np.testing.assert_allclose(aggregate['table'], mean_of_models['table'],
                             atol=1e-6)

  # Each client: rows it ever trained merged, theta_0's rows elsewhere, its
  # own MLP and user vector.
  theta_0 = built.initial_parameters['item_embedding']
  for user in (0, 1):
    (state_u,) = store.get([user])
    np.testing.assert_array_equal(state_u['personal_item_ids'],
                                  sorted(trained_rows[user]))
    vectors = store.table_vectors(np.array([user]),
                                  np.arange(_NUM_ITEMS)[None])[0]
    np.testing.assert_allclose(vectors, own[user]['table'], atol=2e-5)
    untrained = np.setdiff1d(np.arange(_NUM_ITEMS), list(trained_rows[user]))
    np.testing.assert_array_equal(vectors[untrained], theta_0[untrained])
    local = state_u['local_parameters']
    np.testing.assert_allclose(local['user_embedding'], users[user],
                               atol=2e-5)
    for (w, b), layer in zip(own[user]['layers'],
                             local['trained_score_layers']):
      np.testing.assert_allclose(layer['kernel'], w, atol=2e-5)
      np.testing.assert_allclose(layer['bias'], b, atol=2e-5)

  # Scores: users 0 and 1 with their own models, user 2 (never selected)
  # with the served model (the teacher) and its initial p.
  scores = built.score(state, store, method.CandidateItems(
      np.arange(_NUM_USERS)))
  for user, model in ((0, own[0]), (1, own[1]), (2, teacher)):
    np.testing.assert_allclose(
        scores[user], _logits(model, users[user], np.arange(_NUM_ITEMS)),
        atol=5e-5)
  # Round 1 trained user 0 from its own rows, not from the download: the
  # download reading gives user 0 another model.
  download_store, download_state = _train(_build('download'))
  assert np.abs(
      download_store.item_vectors(
          np.array([0]), np.array([[1, 5, 7, 9]]),
          np.array(download_state['global_parameters']['item_embedding']))
      - own[0]['table'][[1, 5, 7, 9]][None]).max() > 1e-3


def test_download_scores_a_user_never_selected_with_the_global_model():
  built = _build('download')
  store, state = _train(built)
  scores = built.score(state, store, method.CandidateItems(
      np.array([2, 1])))
  served = _as_model(state['global_parameters'])
  initial_user = np.array(built.initial_parameters['user_embedding'])
  np.testing.assert_allclose(
      scores[0], _logits(served, initial_user, np.arange(_NUM_ITEMS)),
      atol=5e-5)
  # theta_0's MLP would score it otherwise.
  initial_mlp = dict(served, layers=_as_model(
      built.initial_parameters)['layers'])
  assert np.abs(scores[0] - _logits(initial_mlp, initial_user,
                                    np.arange(_NUM_ITEMS))).max() > 1e-3
  # User 1 trained in round 0: its own trained layers score it.
  (local,) = store.local_parameters([1])
  assert local['has_own_model'] == 1.0
  np.testing.assert_allclose(
      scores[1], _logits(
          dict(table=store.item_vectors(
              np.array([1]), np.arange(_NUM_ITEMS)[None],
              served['table'])[0],
               layers=[(l['kernel'], l['bias'])
                       for l in local['trained_score_layers']]),
          local['user_embedding'], np.arange(_NUM_ITEMS)), atol=5e-5)


def test_own_model_refuses_a_student_start():
  with pytest.raises(ValueError, match='--student_start'):
    _build('own_model', student_start='buffer_average')
