"""Adam (Kingma & Ba, 2015) as a pure function of explicit state.

HeteFedRec trains with Adam, learning rate 0.001 (Sec. V.D). Under TFF the
optimizer state travels with the server state (public parameters) or the
client state (private user embeddings), so the update is written out:

  m <- b1 m + (1 - b1) g,   v <- b2 v + (1 - b2) g^2,   t <- t + 1,
  x <- x - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).

`step` may be a scalar or broadcast against x (e.g. one count per user).
"""

import collections

import tensorflow as tf

AdamState = collections.namedtuple('AdamState', ['m', 'v', 'step'])


def initial_state(params) -> AdamState:
  """Zero moments shaped like `params` (any nest of tensors), step 0."""
  zeros = tf.nest.map_structure(tf.zeros_like, params)
  return AdamState(m=zeros, v=zeros, step=tf.constant(0.0))


def apply(
    params,
    grads,
    state: AdamState,
    *,
    learning_rate: float,
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-8,
):
  """One Adam step on a nest of tensors; returns (new params, new state)."""
  step = state.step + 1.0
  m = tf.nest.map_structure(
      lambda m, g: beta1 * m + (1.0 - beta1) * g, state.m, grads
  )
  v = tf.nest.map_structure(
      lambda v, g: beta2 * v + (1.0 - beta2) * tf.square(g), state.v, grads
  )
  correction1 = 1.0 - tf.pow(beta1, step)
  correction2 = 1.0 - tf.pow(beta2, step)
  new_params = tf.nest.map_structure(
      lambda x, m, v: x
      - learning_rate * (m / correction1) / (tf.sqrt(v / correction2) + epsilon),
      params, m, v,
  )
  return new_params, AdamState(m=m, v=v, step=step)


def apply_per_client(
    params,
    grads,
    state: AdamState,
    active: tf.Tensor,
    *,
    learning_rate: float,
):
  """One Adam step of each of U clients that is `active` (bool [U]).

  Every leaf of `params`, `grads` and the moments has the clients first;
  `state.step` [U] counts each client's own steps. An inactive client
  (a minibatch with none of its examples) keeps its parameters, moments
  and step count, so its bias correction counts only the steps it took.
  """
  new_step = state.step + tf.cast(active, state.step.dtype)

  def leaf_step(x, g, m, v):
    per_client = [-1] + [1] * (len(x.shape) - 1)
    (new_x,), leaf_state = apply(
        (x,), (g,),
        AdamState(m=(m,), v=(v,), step=tf.reshape(state.step, per_client)),
        learning_rate=learning_rate,
    )
    keep_new = tf.reshape(active, per_client)
    return (tf.where(keep_new, new_x, x),
            tf.where(keep_new, leaf_state.m[0], m),
            tf.where(keep_new, leaf_state.v[0], v))

  stepped = [
      leaf_step(*leaves) for leaves in zip(*map(
          tf.nest.flatten, (params, grads, state.m, state.v)))
  ]
  pick = lambda i: tf.nest.pack_sequence_as(params, [s[i] for s in stepped])
  return pick(0), AdamState(m=pick(1), v=pick(2), step=new_step)
