"""Tests of the score functions against numpy references."""

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec import scoring

_NUM_USERS = 3
_NUM_CANDIDATES = 5
_DIM = 4


def _numpy_mlp(inputs, layers):
  """Dense layers with ReLU after every layer but the last; returns [..., C]."""
  hidden = inputs
  for index, (kernel, bias) in enumerate(layers):
    hidden = np.einsum('...ci,...io->...co', hidden, kernel)
    hidden = hidden + bias[..., None, :]
    if index < len(layers) - 1:
      hidden = np.maximum(hidden, 0.0)
  return hidden[..., 0]


def _random_layers(rng, widths, leading=()):
  return [
      (
          rng.normal(size=(*leading, fan_in, fan_out)).astype(np.float32),
          rng.normal(size=(*leading, fan_out)).astype(np.float32),
      )
      for fan_in, fan_out in widths
  ]


def _to_tf(layers):
  return [(tf.constant(k), tf.constant(b)) for k, b in layers]


@pytest.mark.parametrize('hidden_units', [(), (3,), (6, 3)])
def test_score_function_logits_one_user(hidden_units):
  rng = np.random.default_rng(0)
  widths = list(zip((_DIM, *hidden_units), (*hidden_units, 1)))
  layers = _random_layers(rng, widths)
  items = rng.normal(size=(_NUM_CANDIDATES, _DIM)).astype(np.float32)

  got = scoring.score_function_logits(tf.constant(items), _to_tf(layers))

  assert got.shape == (_NUM_CANDIDATES,)
  np.testing.assert_allclose(
      got, _numpy_mlp(items, layers), rtol=1e-5, atol=1e-5
  )


def test_score_function_logits_single_layer_is_affine():
  # One dense layer (the paper's S_i): logit_j = q_j . w + b, no ReLU at all,
  # so negative logits must survive.
  items = np.array([[1.0, 2.0], [-3.0, 0.5]], np.float32)
  kernel = np.array([[2.0], [-1.0]], np.float32)
  bias = np.array([-4.0], np.float32)
  # [1*2 + 2*(-1) - 4, -3*2 + 0.5*(-1) - 4] = [-4, -10.5]
  expected = np.array([-4.0, -10.5], np.float32)

  got = scoring.score_function_logits(
      tf.constant(items), [(tf.constant(kernel), tf.constant(bias))]
  )

  np.testing.assert_allclose(got, expected)


def test_relu_between_hidden_layers_only():
  # Input 1 -> hidden h = relu(1 * [1, -1]) = [1, 0] -> output 2*1 + 3*0 - 5
  # = -3. Without the hidden ReLU it would be 2 - 3 - 5 = -6; with a ReLU
  # on the output it would be 0.
  items = tf.constant([[1.0]])
  layers = [
      (tf.constant([[1.0, -1.0]]), tf.constant([0.0, 0.0])),
      (tf.constant([[2.0], [3.0]]), tf.constant([-5.0])),
  ]

  got = scoring.score_function_logits(items, layers)

  np.testing.assert_allclose(got, [-3.0])


@pytest.mark.parametrize('hidden_units', [(), (6, 3)])
def test_score_function_logits_batch_of_users(hidden_units):
  rng = np.random.default_rng(1)
  widths = list(zip((_DIM, *hidden_units), (*hidden_units, 1)))
  layers = _random_layers(rng, widths, leading=(_NUM_USERS,))
  items = rng.normal(size=(_NUM_USERS, _NUM_CANDIDATES, _DIM)).astype(
      np.float32
  )

  got = scoring.score_function_logits(tf.constant(items), _to_tf(layers))

  assert got.shape == (_NUM_USERS, _NUM_CANDIDATES)
  for u in range(_NUM_USERS):
    user_layers = [(k[u], b[u]) for k, b in layers]
    np.testing.assert_allclose(
        got[u], _numpy_mlp(items[u], user_layers), rtol=1e-5, atol=1e-5
    )


def test_score_function_logits_batch_of_users_with_shared_layers():
  # Items carry a user dimension, the layers do not: they broadcast.
  rng = np.random.default_rng(2)
  layers = _random_layers(rng, [(_DIM, 3), (3, 1)])
  items = rng.normal(size=(_NUM_USERS, _NUM_CANDIDATES, _DIM)).astype(
      np.float32
  )

  got = scoring.score_function_logits(tf.constant(items), _to_tf(layers))

  expected = np.stack([_numpy_mlp(items[u], layers) for u in range(_NUM_USERS)])
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_matrix_factorization_logits_one_user():
  rng = np.random.default_rng(3)
  items = rng.normal(size=(_NUM_CANDIDATES, _DIM)).astype(np.float32)
  user = rng.normal(size=(_DIM,)).astype(np.float32)

  got = scoring.matrix_factorization_logits(
      tf.constant(items), tf.constant(user)
  )

  # <p_u, q_j> for each candidate j.
  expected = np.array([np.dot(user, q) for q in items])
  assert got.shape == (_NUM_CANDIDATES,)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_matrix_factorization_logits_batch_of_users():
  rng = np.random.default_rng(4)
  items = rng.normal(size=(_NUM_USERS, _NUM_CANDIDATES, _DIM)).astype(
      np.float32
  )
  users = rng.normal(size=(_NUM_USERS, _DIM)).astype(np.float32)

  got = scoring.matrix_factorization_logits(
      tf.constant(items), tf.constant(users)
  )

  expected = np.array(
      [[np.dot(users[u], q) for q in items[u]] for u in range(_NUM_USERS)]
  )
  assert got.shape == (_NUM_USERS, _NUM_CANDIDATES)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def _numpy_ncf(items, user, layers):
  """MLP on [p_u ; q_j] (user first) for each candidate j."""
  inputs = np.stack([np.concatenate([user, q]) for q in items])
  return _numpy_mlp(inputs, layers)


def test_neural_cf_logits_one_user():
  rng = np.random.default_rng(5)
  layers = _random_layers(rng, [(2 * _DIM, 6), (6, 3), (3, 1)])
  items = rng.normal(size=(_NUM_CANDIDATES, _DIM)).astype(np.float32)
  user = rng.normal(size=(_DIM,)).astype(np.float32)

  got = scoring.neural_cf_logits(
      tf.constant(items), tf.constant(user), _to_tf(layers)
  )

  assert got.shape == (_NUM_CANDIDATES,)
  np.testing.assert_allclose(
      got, _numpy_ncf(items, user, layers), rtol=1e-5, atol=1e-5
  )


@pytest.mark.parametrize('personal_mlp', [True, False])
def test_neural_cf_logits_batch_of_users(personal_mlp):
  rng = np.random.default_rng(6)
  leading = (_NUM_USERS,) if personal_mlp else ()
  layers = _random_layers(rng, [(2 * _DIM, 6), (6, 1)], leading=leading)
  items = rng.normal(size=(_NUM_USERS, _NUM_CANDIDATES, _DIM)).astype(
      np.float32
  )
  users = rng.normal(size=(_NUM_USERS, _DIM)).astype(np.float32)

  got = scoring.neural_cf_logits(
      tf.constant(items), tf.constant(users), _to_tf(layers)
  )

  assert got.shape == (_NUM_USERS, _NUM_CANDIDATES)
  for u in range(_NUM_USERS):
    user_layers = [
        (k[u], b[u]) if personal_mlp else (k, b) for k, b in layers
    ]
    np.testing.assert_allclose(
        got[u], _numpy_ncf(items[u], users[u], user_layers),
        rtol=1e-5, atol=1e-5,
    )


def test_neural_cf_concatenates_user_before_item():
  # d = 1, one linear layer with kernel [[1], [0]] reads only the first half
  # of [p_u ; q_j], i.e. the user: every candidate gets logit p_u = 7.
  items = tf.constant([[2.0], [3.0]])
  user = tf.constant([7.0])
  layers = [(tf.constant([[1.0], [0.0]]), tf.constant([0.0]))]

  got = scoring.neural_cf_logits(items, user, layers)

  np.testing.assert_allclose(got, [7.0, 7.0])


def test_neural_cf_logits_inside_tf_function_with_unknown_candidate_count():
  rng = np.random.default_rng(7)
  np_layers = _random_layers(rng, [(2 * _DIM, 3), (3, 1)])
  np_items = rng.normal(size=(_NUM_CANDIDATES, _DIM)).astype(np.float32)
  np_user = rng.normal(size=(_DIM,)).astype(np.float32)
  layers = _to_tf(np_layers)
  items, user = tf.constant(np_items), tf.constant(np_user)

  # Dynamic candidate count: the shapes are only known at run time.
  traced = tf.function(
      scoring.neural_cf_logits,
      input_signature=[
          tf.TensorSpec([None, _DIM], tf.float32),
          tf.TensorSpec([_DIM], tf.float32),
          [
              (tf.TensorSpec(k.shape), tf.TensorSpec(b.shape))
              for k, b in layers
          ],
      ],
  )

  np.testing.assert_allclose(
      traced(items, user, layers),
      _numpy_ncf(np_items, np_user, np_layers),
      rtol=1e-5, atol=1e-5,
  )
