import numpy as np
import tensorflow as tf

from tff_fedrec import adam


def _numpy_adam(x, grads, lr, b1=0.9, b2=0.999, eps=1e-8):
  m = v = np.zeros_like(x)
  for t, g in enumerate(grads, start=1):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    x = x - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
  return x


def test_three_steps_match_numpy_and_keras():
  rng = np.random.default_rng(0)
  x0 = rng.normal(size=(3, 2)).astype(np.float32)
  grads = [rng.normal(size=(3, 2)).astype(np.float32) for _ in range(3)]
  params, state = tf.constant(x0), adam.initial_state(tf.constant(x0))
  for g in grads:
    params, state = adam.apply(params, tf.constant(g), state,
                               learning_rate=0.01)
  np.testing.assert_allclose(params, _numpy_adam(x0, grads, 0.01), rtol=1e-5)
  # Keras' Adam with the same epsilon convention agrees.
  variable = tf.Variable(x0)
  optimizer = tf.keras.optimizers.Adam(learning_rate=0.01, epsilon=1e-8)
  for g in grads:
    optimizer.apply_gradients([(tf.constant(g), variable)])
  np.testing.assert_allclose(params, variable.numpy(), rtol=1e-4, atol=1e-6)
  assert float(state.step) == 3.0


def test_first_step_moves_each_entry_by_the_learning_rate():
  # t = 1: m_hat = g, v_hat = g^2, so the step is lr * sign(g) (eps aside).
  params, _ = adam.apply(
      tf.constant([1.0, 1.0]), tf.constant([5.0, -0.2]),
      adam.initial_state(tf.constant([1.0, 1.0])), learning_rate=0.1,
  )
  np.testing.assert_allclose(params, [0.9, 1.1], rtol=1e-6)


def test_per_entry_steps_broadcast():
  # Two users with their own step counts: user 1 is at its 2nd step.
  state = adam.AdamState(
      m=tf.constant([[0.0], [1.0]]), v=tf.constant([[0.0], [1.0]]),
      step=tf.constant([[0.0], [1.0]]),
  )
  params, new_state = adam.apply(
      tf.constant([[0.0], [0.0]]), tf.constant([[1.0], [1.0]]), state,
      learning_rate=1.0,
  )
  np.testing.assert_array_equal(new_state.step, [[1.0], [2.0]])
  # User 0: first step of size 1. User 1: m = 1, v = 1 -> m_hat = 1 / 0.19,
  # v_hat = 1 / 0.001999 -> step ~ 0.235.
  expected_1 = (1 / (1 - 0.9**2)) / (np.sqrt(1 / (1 - 0.999**2)) + 1e-8)
  np.testing.assert_allclose(params[:, 0], [-1.0, -expected_1], rtol=1e-4)


def test_per_client_steps_skip_inactive_clients():
  # Three clients, each with a [2] vector and a [2, 3] matrix. Client 1 sits
  # out the second step, so its third step is its own second: its bias
  # correction must count 2, not 3, and its moments must not decay while
  # it waits. Each client is checked against numpy Adam on the gradients
  # it actually took.
  rng = np.random.default_rng(4)
  x0 = (rng.normal(size=(3, 2)).astype(np.float32),
        rng.normal(size=(3, 2, 3)).astype(np.float32))
  grads = [tuple(rng.normal(size=x.shape).astype(np.float32) for x in x0)
           for _ in range(3)]
  active = [[True, True, True], [True, False, True], [True, True, True]]
  params = tuple(tf.constant(x) for x in x0)
  state = adam.initial_state(params)
  state = state._replace(step=tf.zeros([3]))
  for g, a in zip(grads, active):
    params, state = adam.apply_per_client(
        params, tuple(tf.constant(x) for x in g), state, tf.constant(a),
        learning_rate=0.01,
    )
  np.testing.assert_array_equal(state.step, [3.0, 2.0, 3.0])
  for client in range(3):
    taken = [s for s, a in enumerate(active) if a[client]]
    for leaf in range(2):
      expected = _numpy_adam(
          x0[leaf][client], [grads[s][leaf][client] for s in taken], 0.01)
      np.testing.assert_allclose(params[leaf][client], expected, rtol=1e-5)
