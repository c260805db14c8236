"""RF²'s process: one user's step against finite differences of its loss,
and one round against numpy (the sample-weighted mean of the users' deltas,
then PyTorch's Adagrad from a zero accumulator), for groups of any size and
with Channel's masks."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec import tier_codecs
from tff_fedrec.algorithms.rf2 import models
from tff_fedrec.algorithms.rf2 import process
from tff_fedrec.programs import execution
from tff_fedrec.templates import two_phase

_SPEC = models.ClickModelSpec('dlrm', num_items=6, num_genres=3,
                              embedding_dim=4, hidden_units=8)


@pytest.fixture(scope='module', autouse=True)
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


def _params(seed=0):
  rng = np.random.default_rng(seed)
  return tf.nest.map_structure(
      lambda x: rng.normal(0, 0.5, x.shape).astype(np.float32),
      models.initial_parameters(_SPEC, rng))


def _user(seed, n):
  rng = np.random.default_rng(seed)
  return collections.OrderedDict(
      item=rng.integers(0, 6, n).astype(np.int32),
      genres=rng.integers(0, 4, [n, 2]).astype(np.int32),
      history=rng.integers(0, 7, [n, 3]).astype(np.int32),
      label=rng.integers(0, 2, n).astype(np.float32))


def _loss(params, user):
  """The user's loss in float64 numpy through the TF forward."""
  logits = models.logits(_SPEC, params, user).numpy().astype(np.float64)
  y = user['label']
  bce = np.mean(np.maximum(logits, 0) - logits * y
                + np.log1p(np.exp(-np.abs(logits))))
  l2 = sum(np.sum(np.asarray(params[t], np.float64) ** 2)
           for t in models.EMBEDDING_TABLES)
  return bce + process.EMBEDDING_L2 * l2


def test_a_users_delta_is_the_rate_times_the_gradient_of_its_loss():
  params, user = _params(), _user(0, 9)
  features = collections.OrderedDict(
      (k, user[k]) for k in ('item', 'genres', 'history'))
  delta, total = process.user_delta(_SPEC, params, features, user['label'],
                                    np.ones(9, np.float32))
  logits = models.logits(_SPEC, params, features).numpy()
  assert float(total) == pytest.approx(float(np.sum(
      tf.nn.sigmoid_cross_entropy_with_logits(user['label'], logits))),
                                       rel=1e-5)
  rng = np.random.default_rng(1)
  for path in (('item_embedding',), ('history_embedding',),
               ('top_mlp', 'hidden_kernel'), ('top_mlp', 'output_bias')):
    leaf = params
    got = delta
    for key in path:
      leaf, got = leaf[key], got[key]
    for _ in range(3):
      index = tuple(rng.integers(0, s) for s in leaf.shape)
      h = 1e-2
      plus = tf.nest.map_structure(np.copy, params)
      minus = tf.nest.map_structure(np.copy, params)
      target_plus, target_minus = plus, minus
      for key in path:
        target_plus, target_minus = target_plus[key], target_minus[key]
      target_plus[index] += h
      target_minus[index] -= h
      numeric = (_loss(plus, user) - _loss(minus, user)) / (2 * h)
      assert float(got.numpy()[index]) == pytest.approx(
          process.CLIENT_LEARNING_RATE * numeric, rel=2e-2, abs=2e-5)


def _group(users, seeds, tier):
  width = max(u['label'].size for u in users)

  def pad(key, dtype):
    first = users[0][key]
    out = np.zeros([len(users), width, *first.shape[1:]], dtype)
    for i, u in enumerate(users):
      out[i, :u[key].shape[0]] = u[key]
    return out

  return collections.OrderedDict(
      item=pad('item', np.int32), genres=pad('genres', np.int32),
      history=pad('history', np.int32), label=pad('label', np.float32),
      num_examples=np.array([u['label'].size for u in users], np.int32),
      tier=np.full(len(users), tier, np.int32),
      seed=np.array(seeds, np.int64))


def _numpy_round(params, users, masks=None):
  """w - 0.1 g / (|g| + 1e-10), g the n-weighted (per element, masked)
  mean of the users' deltas (the code's FedAvg + torch Adagrad from 0)."""
  flat = tf.nest.flatten(params)
  sums = [np.zeros_like(x, np.float64) for x in flat]
  counts = [np.zeros_like(x, np.float64) for x in flat]
  for index, user in enumerate(users):
    features = collections.OrderedDict(
        (k, user[k]) for k in ('item', 'genres', 'history'))
    mask = None if masks is None else masks[index]
    delta, _ = process.user_delta(_SPEC, params, features, user['label'],
                                  np.ones(user['label'].size, np.float32),
                                  channel_mask=mask)
    m = [1.0] * len(flat) if mask is None else tf.nest.flatten(mask)
    for k, d in enumerate(tf.nest.flatten(delta)):
      weight = user['label'].size * np.broadcast_to(m[k], flat[k].shape)
      sums[k] += weight * d.numpy()
      counts[k] += weight
  g = [np.where(c > 0, s / np.maximum(c, 1e-30), 0) for s, c in
       zip(sums, counts)]
  return tf.nest.pack_sequence_as(
      params, [x - 0.1 * gi / (np.abs(gi) + 1e-10) for x, gi in zip(flat, g)])


def _run(process_, params, groups):
  state = process_.initialize()
  state, _, _ = two_phase.run_round(
      process_, state, [collections.OrderedDict()] * len(groups), groups)
  return state['global_parameters']


def _build(params, channel=None):
  return process.build_process(
      _SPEC, params, codecs=(tier_codecs.UpdateCodec(),) * 3,
      channel_multipliers=channel, server_learning_rate=0.1,
      genres_width=2, history_length=3)


def test_a_round_is_fedavg_then_pytorchs_adagrad_for_any_grouping():
  params = _params(2)
  users = [_user(10 + i, n) for i, n in enumerate((4, 9, 2))]
  want = _numpy_round(params, users)
  process_ = _build(params)
  one_group = _run(process_, params, [_group(users, [[1, 2]] * 3, 2)])
  singles = _run(process_, params,
                 [_group([u], [[1, 2]], 2) for u in users])
  for got in (one_group, singles):
    for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_channel_tiers_train_their_sub_model_and_average_per_element():
  params = _params(3)
  users = [_user(20 + i, 6) for i in range(3)]
  multipliers = (0.25, 0.5, 1.0)
  masks = [models.channel_masks(_SPEC, m) for m in multipliers]
  want = _numpy_round(params, users, masks)
  got = _run(_build(params, multipliers), params,
             [_group([u], [[3, 4]], tier) for tier, u in enumerate(users)])
  for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
