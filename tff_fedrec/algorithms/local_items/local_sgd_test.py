"""Tests of one client's local training against a reference of Algorithm 1.

The reference below is written independently of `models` and `scoring`: plain
eager TF with `tf.Variable`s, dense gradients (so duplicate items in a batch
accumulate and rows of absent items get a zero gradient) and explicit SGD.
"""

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec import models
from tff_fedrec.algorithms.local_items import local_sgd

_NUM_ITEMS = 12
_DIM = 4
_LEARNING_RATE = 0.3
_ITEM_LEARNING_RATE = 4.0
_BATCH_SIZE = 4

# 11 examples in batches of 4, 4, 3 (ragged last batch). Item 3 appears twice
# in the first batch, item 1 twice in the second, item 2 twice in the third.
# Items 4, 6, 8, 10 and 11 are not in the data.
_ITEMS = np.array([3, 0, 3, 7, 1, 1, 5, 9, 0, 2, 2], np.int32)
_LABELS = np.array([1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 0], np.float32)
_ABSENT_ITEMS = np.array([4, 6, 8, 10, 11])

_SPECS = {
    'score_function': models.RecommenderSpec(
        'score_function', _NUM_ITEMS, _DIM, (3,)
    ),
    'score_function_linear': models.RecommenderSpec(
        'score_function', _NUM_ITEMS, _DIM
    ),
    'matrix_factorization': models.RecommenderSpec(
        'matrix_factorization', _NUM_ITEMS, _DIM
    ),
    'neural_cf_global_mlp': models.RecommenderSpec(
        'neural_cf', _NUM_ITEMS, _DIM, (5,), personal_score_layers=False
    ),
    'neural_cf_personal_mlp': models.RecommenderSpec(
        'neural_cf', _NUM_ITEMS, _DIM, (5,), personal_score_layers=True
    ),
}


def _initial_params(spec, seed=0):
  params = models.initial_parameters(spec, seed=seed)
  if spec.has_user_embedding:
    # A user embedding of norm ~1 so the item gradients are not tiny.
    params['user_embedding'] = np.random.default_rng(seed + 100).normal(
        size=[_DIM]
    ).astype(np.float32)
  return params


def _reference_logits(spec, params, items):
  """Eq. (6) before the sigmoid, written out for each architecture."""
  q = tf.gather(params['item_embedding'], items)
  if spec.architecture == 'matrix_factorization':
    return tf.reduce_sum(q * params['user_embedding'][None, :], axis=1)
  if spec.architecture == 'neural_cf':
    p = tf.tile(params['user_embedding'][None, :], [tf.shape(items)[0], 1])
    hidden = tf.concat([p, q], axis=1)
  else:
    hidden = q
  layers = params['score_layers']
  for index, layer in enumerate(layers):
    hidden = hidden @ layer['kernel'] + layer['bias']
    if index < len(layers) - 1:
      hidden = tf.nn.relu(hidden)
  return hidden[:, 0]


def _reference_loss(spec, params, items, labels):
  """Eq. (7) averaged over the batch."""
  probs = tf.sigmoid(_reference_logits(spec, params, items))
  return -tf.reduce_mean(
      labels * tf.math.log(probs) + (1.0 - labels) * tf.math.log(1.0 - probs)
  )


def _reference_term(targets, student, weight):
  """The toy loss term of these tests: weight x the batch's mean squared
  distance of the logits to per-example targets."""
  return weight * tf.reduce_mean(tf.square(student - targets))


def _reference_train(
    spec, params, items, labels, *, batch_size, local_epochs, learning_rate,
    item_learning_rate, alternating, shuffle_seed, targets=None,
    term_weight=0.0, first_keys=None, user_learning_rate=None,
):
  """Algorithm 1, ClientUpdate lines 5-11 (alternating) or joint SGD; with
  `targets` [n] the loss adds `_reference_term`; the user embedding steps
  at `user_learning_rate` if given."""
  variables = tf.nest.map_structure(tf.Variable, params)
  # The declaration (models_test checks it): item embedding global, user
  # embedding local, score layers local iff personal.
  local_keys = first_keys or [
      k for k in variables
      if k == 'user_embedding'
      or (k == 'score_layers' and spec.personal_score_layers)
  ]
  global_keys = [k for k in variables if k not in local_keys]

  def sgd_step(keys, batch_items, batch_labels, batch_targets):
    trained = tf.nest.flatten([variables[k] for k in keys])
    with tf.GradientTape() as tape:
      loss = _reference_loss(spec, variables, batch_items, batch_labels)
      if batch_targets is not None:
        loss += _reference_term(
            batch_targets, _reference_logits(spec, variables, batch_items),
            term_weight)
    grads = tape.gradient(loss, trained)
    for variable, grad in zip(trained, grads):
      rate = (
          item_learning_rate
          if variable is variables['item_embedding']
          else learning_rate
      )
      if (user_learning_rate is not None
          and variable is variables.get('user_embedding')):
        rate = user_learning_rate
      # Densified: duplicate rows sum, absent rows get exactly 0.
      variable.assign_sub(rate * tf.convert_to_tensor(grad))
    return float(loss)

  n = len(items)
  loss_sum = 0.0
  for epoch in range(local_epochs):
    if epoch == 0:
      order = np.arange(n)
    else:
      # The module documents a stateless reshuffle from `shuffle_seed`;
      # epoch e uses seed + e.
      order = tf.random.experimental.stateless_shuffle(
          tf.range(n), seed=shuffle_seed + epoch
      ).numpy()
    for start in range(0, n, batch_size):
      index = order[start : start + batch_size]
      batch_items = tf.constant(items[index])
      batch_labels = tf.constant(labels[index])
      batch_targets = (None if targets is None
                       else tf.constant(targets[index], tf.float32))
      batch = (batch_items, batch_labels, batch_targets)
      if alternating and local_keys:
        sgd_step(local_keys, *batch)  # lines 8-9
        loss = sgd_step(global_keys, *batch)  # lines 10-11
      else:
        loss = sgd_step(list(variables), *batch)
      loss_sum += loss * len(index)
  trained_params = tf.nest.map_structure(lambda v: v.numpy(), variables)
  return trained_params, loss_sum


def _train(spec, params, items=_ITEMS, labels=_LABELS, *, seed=(1, 2),
           **kwargs):
  options = dict(
      batch_size=_BATCH_SIZE,
      local_epochs=1,
      learning_rate=_LEARNING_RATE,
      item_learning_rate=_ITEM_LEARNING_RATE,
      alternating=True,
  )
  options.update(kwargs)
  return local_sgd.train_locally(
      spec,
      params,
      tf.constant(items),
      tf.constant(labels),
      shuffle_seed=tf.constant(seed, tf.int64),
      **options,
  )


def _assert_params_close(got, expected):
  assert tuple(got) == tuple(expected)
  tf.nest.map_structure(
      lambda g, e: np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6),
      tf.nest.map_structure(np.asarray, got),
      expected,
  )


@pytest.mark.parametrize('alternating', [True, False])
@pytest.mark.parametrize('spec_name', list(_SPECS))
def test_train_locally_matches_reference(spec_name, alternating):
  spec = _SPECS[spec_name]
  params = _initial_params(spec)

  result = _train(spec, params, alternating=alternating)
  expected, expected_loss_sum = _reference_train(
      spec, params, _ITEMS, _LABELS, batch_size=_BATCH_SIZE, local_epochs=1,
      learning_rate=_LEARNING_RATE, item_learning_rate=_ITEM_LEARNING_RATE,
      alternating=alternating, shuffle_seed=np.array([1, 2], np.int64),
  )

  _assert_params_close(result.parameters, expected)
  # Every parameter group moved (the test would be vacuous otherwise).
  for key in spec.keys:
    assert not all(
        np.array_equal(a, b)
        for a, b in zip(tf.nest.flatten(expected[key]),
                        tf.nest.flatten(params[key]))
    ), key
  np.testing.assert_allclose(result.loss_sum, expected_loss_sum, rtol=1e-5)
  assert int(result.num_examples) == len(_ITEMS)


def test_alternating_and_joint_updates_differ():
  # The flag must matter where there are local parameters: the item step sees
  # the already-updated score function only in the alternating form.
  spec = _SPECS['score_function']
  params = _initial_params(spec)

  alternating = _train(spec, params, alternating=True)
  joint = _train(spec, params, alternating=False)

  assert not np.allclose(
      alternating.parameters['item_embedding'],
      joint.parameters['item_embedding'],
  )


@pytest.mark.parametrize('alternating', [True, False])
def test_rows_of_items_not_in_the_data_stay_exactly_unchanged(alternating):
  spec = _SPECS['neural_cf_global_mlp']
  params = _initial_params(spec)

  result = _train(spec, params, alternating=alternating)

  item_embedding = result.parameters['item_embedding'].numpy()
  np.testing.assert_array_equal(
      item_embedding[_ABSENT_ITEMS], params['item_embedding'][_ABSENT_ITEMS]
  )
  present = np.unique(_ITEMS)
  assert np.all(
      np.any(item_embedding[present] != params['item_embedding'][present], 1)
  )


def test_duplicate_items_in_a_batch_accumulate_gradients():
  spec = _SPECS['matrix_factorization']
  params = _initial_params(spec)
  items = np.array([3, 5, 3], np.int32)
  labels = np.array([1.0, 0.0, 0.0], np.float32)
  p = params['user_embedding'].astype(np.float64)
  q = params['item_embedding'].astype(np.float64)

  result = _train(spec, params, items, labels, batch_size=3, alternating=False)

  # Mean BCE over n = 3 with z_j = <p, q_j>: dL/dz_j = (sigmoid(z_j) - y_j) / 3.
  # Item 3 occurs twice (y = 1 and y = 0), so its row gradient is the sum
  # ((s3 - 1) + s3) / 3 * p, not one of the two terms; item 5 gets s5 / 3 * p.
  s3 = 1 / (1 + np.exp(-q[3] @ p))
  s5 = 1 / (1 + np.exp(-q[5] @ p))
  expected_q3 = q[3] - _ITEM_LEARNING_RATE * ((s3 - 1) + s3) / 3 * p
  expected_q5 = q[5] - _ITEM_LEARNING_RATE * s5 / 3 * p
  # Joint step: p moves with the old rows.
  expected_p = p - _LEARNING_RATE * (((s3 - 1) + s3) * q[3] + s5 * q[5]) / 3

  item_embedding = result.parameters['item_embedding'].numpy()
  np.testing.assert_allclose(item_embedding[3], expected_q3, rtol=1e-5)
  np.testing.assert_allclose(item_embedding[5], expected_q5, rtol=1e-5)
  np.testing.assert_allclose(
      result.parameters['user_embedding'], expected_p, rtol=1e-5
  )
  others = np.setdiff1d(np.arange(_NUM_ITEMS), [3, 5])
  np.testing.assert_array_equal(
      item_embedding[others], params['item_embedding'][others]
  )


def test_item_gradient_map_multiplies_the_row_gradients_only():
  # One example (item 2, label 1), joint step: dL/dz = s - 1 with
  # s = sigmoid(<p, q>); q' = q - lr_item (s - 1) p M, p' = p - lr (s - 1) q.
  spec = _SPECS['matrix_factorization']
  params = _initial_params(spec)
  gradient_map = np.random.default_rng(4).normal(size=[_DIM, _DIM])
  p = params['user_embedding'].astype(np.float64)
  q = params['item_embedding'][2].astype(np.float64)
  s = 1 / (1 + np.exp(-p @ q))

  result = local_sgd.train_locally(
      spec, params, tf.constant([2]), tf.constant([1.0]),
      batch_size=_BATCH_SIZE, local_epochs=1, learning_rate=_LEARNING_RATE,
      item_learning_rate=_ITEM_LEARNING_RATE, alternating=False,
      shuffle_seed=tf.constant([0, 0], tf.int64),
      item_gradient_map=tf.constant(gradient_map, tf.float32),
  )

  np.testing.assert_allclose(
      result.parameters['item_embedding'][2],
      q - _ITEM_LEARNING_RATE * (s - 1) * p @ gradient_map, rtol=1e-5,
  )
  np.testing.assert_allclose(
      result.parameters['user_embedding'], p - _LEARNING_RATE * (s - 1) * q,
      rtol=1e-5,
  )


def test_alternating_step_on_matrix_factorization_by_hand():
  # One example (item 2, label 1), z = <p, q>, dL/dz = s - 1, s = sigmoid(z).
  # Line 9:  p' = p - lr (s - 1) q           (q fixed)
  # Line 11: q' = q - lr_item (s' - 1) p'    with s' = sigmoid(<p', q>).
  spec = _SPECS['matrix_factorization']
  params = _initial_params(spec)
  p = params['user_embedding'].astype(np.float64)
  q = params['item_embedding'][2].astype(np.float64)
  s = 1 / (1 + np.exp(-p @ q))
  p_new = p - _LEARNING_RATE * (s - 1) * q
  s_new = 1 / (1 + np.exp(-p_new @ q))
  q_new = q - _ITEM_LEARNING_RATE * (s_new - 1) * p_new

  result = _train(
      spec, params, np.array([2], np.int32), np.array([1.0], np.float32),
      alternating=True,
  )

  np.testing.assert_allclose(result.parameters['user_embedding'], p_new,
                             rtol=1e-5)
  np.testing.assert_allclose(result.parameters['item_embedding'][2], q_new,
                             rtol=1e-5)
  # The reported loss is the recomputed one of line 10: -log s'.
  np.testing.assert_allclose(result.loss_sum, -np.log(s_new), rtol=1e-5)


@pytest.mark.parametrize(
    'spec_name', ['score_function', 'neural_cf_global_mlp']
)
def test_two_epochs_match_reference(spec_name):
  spec = _SPECS[spec_name]
  params = _initial_params(spec)
  seed = np.array([5, 9], np.int64)

  result = _train(spec, params, seed=seed, local_epochs=2)
  expected, _ = _reference_train(
      spec, params, _ITEMS, _LABELS, batch_size=_BATCH_SIZE, local_epochs=2,
      learning_rate=_LEARNING_RATE, item_learning_rate=_ITEM_LEARNING_RATE,
      alternating=True, shuffle_seed=seed,
  )

  _assert_params_close(result.parameters, expected)


def test_second_epoch_reshuffles_deterministically_from_the_seed():
  spec = _SPECS['score_function']
  params = _initial_params(spec)

  first = _train(spec, params, seed=(5, 9), local_epochs=2)
  again = _train(spec, params, seed=(5, 9), local_epochs=2)
  other = _train(spec, params, seed=(6, 1), local_epochs=2)

  tf.nest.map_structure(
      np.testing.assert_array_equal, first.parameters, again.parameters
  )
  assert not np.allclose(
      first.parameters['item_embedding'], other.parameters['item_embedding']
  )


def test_first_epoch_ignores_the_seed():
  # The first epoch visits the examples in the given order.
  spec = _SPECS['score_function']
  params = _initial_params(spec)

  first = _train(spec, params, seed=(5, 9))
  other = _train(spec, params, seed=(6, 1))

  tf.nest.map_structure(
      np.testing.assert_array_equal, first.parameters, other.parameters
  )


def test_no_examples_leaves_parameters_unchanged():
  spec = _SPECS['neural_cf_personal_mlp']
  params = _initial_params(spec)

  result = _train(
      spec, params, np.zeros([0], np.int32), np.zeros([0], np.float32)
  )

  tf.nest.map_structure(
      np.testing.assert_array_equal,
      tf.nest.map_structure(np.asarray, result.parameters),
      params,
  )
  assert float(result.loss_sum) == 0.0
  assert int(result.num_examples) == 0


def test_loss_sum_over_num_examples_is_the_mean_loss_with_two_epochs():
  spec = _SPECS['matrix_factorization']
  params = _initial_params(spec)

  # With zero learning rates nothing moves, so every batch of every epoch
  # sees the initial model and the per-example training loss is the mean
  # BCE of the initial model over the data.
  result = _train(
      spec, params, local_epochs=2, learning_rate=0.0, item_learning_rate=0.0
  )
  expected = _reference_loss(
      spec, tf.nest.map_structure(tf.constant, params), tf.constant(_ITEMS),
      tf.constant(_LABELS),
  )

  np.testing.assert_allclose(
      result.loss_sum / tf.cast(result.num_examples, tf.float32), expected,
      rtol=1e-5,
  )


def test_train_locally_in_a_tf1_graph_matches_reference():
  spec = _SPECS['matrix_factorization']
  params = _initial_params(spec)
  expected, _ = _reference_train(
      spec, params, _ITEMS, _LABELS, batch_size=_BATCH_SIZE, local_epochs=1,
      learning_rate=_LEARNING_RATE, item_learning_rate=_ITEM_LEARNING_RATE,
      alternating=False, shuffle_seed=np.array([1, 2], np.int64),
  )

  graph = tf.Graph()
  with graph.as_default():
    items = tf.compat.v1.placeholder(tf.int32, [None])
    labels = tf.compat.v1.placeholder(tf.float32, [None])
    result = local_sgd.train_locally(
        spec, params, items, labels, batch_size=_BATCH_SIZE, local_epochs=1,
        learning_rate=_LEARNING_RATE, item_learning_rate=_ITEM_LEARNING_RATE,
        alternating=False, shuffle_seed=tf.constant([1, 2], tf.int64),
    )
    with tf.compat.v1.Session(graph=graph) as session:
      got = session.run(result.parameters, {items: _ITEMS, labels: _LABELS})

  _assert_params_close(got, expected)


@pytest.mark.parametrize('alternating', [True, False])
@pytest.mark.parametrize(
    'spec_name', ['score_function', 'matrix_factorization',
                  'neural_cf_global_mlp']
)
def test_users_trained_together_match_each_trained_alone(
    spec_name, alternating
):
  spec = _SPECS[spec_name]
  # Three users with 11, 3 and 0 examples (one, one and no batch of 4 are
  # ragged), each with its own parameters and seed; two epochs reshuffle.
  users = [
      (_ITEMS, _LABELS, (1, 2)),
      (_ITEMS[:3], _LABELS[:3], (5, 6)),
      (_ITEMS[:0], _LABELS[:0], (7, 8)),
  ]
  params = [_initial_params(spec, seed=s) for s in range(3)]
  options = dict(
      batch_size=_BATCH_SIZE, local_epochs=2, learning_rate=_LEARNING_RATE,
      item_learning_rate=_ITEM_LEARNING_RATE, alternating=alternating,
  )
  alone = [
      _train(spec, p, items, labels, seed=seed, **options)
      for p, (items, labels, seed) in zip(params, users)
  ]
  max_n = len(_ITEMS)
  padded = lambda a: np.pad(a, [0, max_n - len(a)])
  together = local_sgd.train_users_locally(
      spec,
      tf.nest.map_structure(lambda *leaves: np.stack(leaves), *params),
      tf.constant(np.stack([padded(u[0]) for u in users])),
      tf.constant(np.stack([padded(u[1]) for u in users])),
      tf.constant([len(u[0]) for u in users], tf.int32),
      shuffle_seeds=tf.constant([u[2] for u in users], tf.int64),
      **options,
  )

  for index, single in enumerate(alone):
    _assert_params_close(
        tf.nest.map_structure(lambda t: t[index], together.parameters),
        tf.nest.map_structure(np.asarray, single.parameters),
    )
    np.testing.assert_allclose(
        together.loss_sum[index], single.loss_sum, rtol=1e-5
    )
    assert int(together.num_examples[index]) == int(single.num_examples)
  # The user without data kept its parameters exactly.
  tf.nest.map_structure(
      np.testing.assert_array_equal,
      tf.nest.map_structure(lambda t: np.asarray(t[2]), together.parameters),
      params[2],
  )


_TARGETS = np.array(
    [2.0, -1.5, 0.5, 3.0, -0.5, 1.0, -2.0, 0.0, 1.5, -1.0, 2.5], np.float32)


def _toy_term(weight):
  """`_reference_term` as a `LossTerm` of one user, its targets gathered
  with each batch."""

  def term(logits, batch):
    counts = tf.maximum(tf.reduce_sum(batch.mask, axis=1), 1.0)
    squared = tf.square(logits - batch.examples['targets']) * batch.mask
    return weight * tf.reduce_sum(squared, axis=1) / counts

  return local_sgd.LossTerm(examples={'targets': tf.constant(_TARGETS)},
                            fn=term)


@pytest.mark.parametrize('alternating', [True, False])
def test_a_methods_loss_term_is_added_to_every_step(alternating):
  # A method's own term (APFR-GKD's distillation is one): its per-example
  # inputs follow the batches' order, over two epochs that reshuffle.
  spec = _SPECS['neural_cf_global_mlp']
  params = _initial_params(spec)
  result = _train(spec, params, alternating=alternating, local_epochs=2,
                  loss_term=_toy_term(0.7))
  expected, expected_loss_sum = _reference_train(
      spec, params, _ITEMS, _LABELS, batch_size=_BATCH_SIZE, local_epochs=2,
      learning_rate=_LEARNING_RATE, item_learning_rate=_ITEM_LEARNING_RATE,
      alternating=alternating, shuffle_seed=np.array([1, 2], np.int64),
      targets=_TARGETS, term_weight=0.7,
  )
  _assert_params_close(result.parameters, expected)
  np.testing.assert_allclose(result.loss_sum, expected_loss_sum, rtol=1e-5)
  # The term changed the result (else the test is vacuous).
  without, _ = _reference_train(
      spec, params, _ITEMS, _LABELS, batch_size=_BATCH_SIZE, local_epochs=2,
      learning_rate=_LEARNING_RATE, item_learning_rate=_ITEM_LEARNING_RATE,
      alternating=alternating, shuffle_seed=np.array([1, 2], np.int64),
  )
  assert np.abs(np.asarray(result.parameters['item_embedding'])
                - without['item_embedding']).max() > 1e-3


def test_alternating_with_first_keys_steps_those_first():
  # APFR-GKD's Dual phase: user embedding and shared MLP first, then the
  # item rows (PFedRec-style with the score function shared).
  spec = _SPECS['neural_cf_global_mlp']
  params = _initial_params(spec)
  first = ('user_embedding', 'score_layers')
  result = _train(spec, params, alternating=True, first_keys=first)
  expected, _ = _reference_train(
      spec, params, _ITEMS, _LABELS, batch_size=_BATCH_SIZE, local_epochs=1,
      learning_rate=_LEARNING_RATE, item_learning_rate=_ITEM_LEARNING_RATE,
      alternating=True, shuffle_seed=np.array([1, 2], np.int64),
      first_keys=list(first),
  )
  _assert_params_close(result.parameters, expected)
  default_order = _train(spec, params, alternating=True)
  assert np.abs(np.asarray(default_order.parameters['item_embedding'])
                - expected['item_embedding']).max() > 1e-4


@pytest.mark.parametrize('alternating', [True, False])
@pytest.mark.parametrize(
    'spec_name', ['matrix_factorization', 'neural_cf_global_mlp'])
def test_user_learning_rate_steps_the_user_embedding_only(spec_name,
                                                          alternating):
  spec = _SPECS[spec_name]
  params = _initial_params(spec)
  user_rate = 2.0
  result = _train(spec, params, alternating=alternating, local_epochs=2,
                  user_learning_rate=user_rate)
  expected, _ = _reference_train(
      spec, params, _ITEMS, _LABELS, batch_size=_BATCH_SIZE, local_epochs=2,
      learning_rate=_LEARNING_RATE, item_learning_rate=_ITEM_LEARNING_RATE,
      alternating=alternating, shuffle_seed=np.array([1, 2], np.int64),
      user_learning_rate=user_rate,
  )
  _assert_params_close(result.parameters, expected)
  # The user embedding's rate is not the MLP's (nor the items'): at the
  # shared rate the result differs.
  shared, _ = _reference_train(
      spec, params, _ITEMS, _LABELS, batch_size=_BATCH_SIZE, local_epochs=2,
      learning_rate=_LEARNING_RATE, item_learning_rate=_ITEM_LEARNING_RATE,
      alternating=alternating, shuffle_seed=np.array([1, 2], np.int64),
  )
  assert np.abs(np.asarray(result.parameters['user_embedding'])
                - shared['user_embedding']).max() > 1e-3
