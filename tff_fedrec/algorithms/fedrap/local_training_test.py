"""Tests of FedRAP's local SGD against a numpy reading of the reference
code's round: dense D and C tables, PyTorch's SGD with weight decay on
every row, ExponentialLR stepped after every batch, learning rates x
decay_rate^round."""

import collections
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec.algorithms.fedrap import local_training

_NUM_ITEMS, _DIM = 12, 3
_CONFIG = local_training.FedRAPTrainingConfig(
    learning_rate=0.4, item_learning_rate=3.0, batch_size=4, local_epochs=3,
    weight_decay=0.05, batch_lr_decay=0.9, round_lr_decay=0.8, lam=0.3,
    mu=0.2,
)


def _sigmoid(z):
  return 1.0 / (1.0 + np.exp(-z))


def _numpy_round(d_table, c_table, kernel, bias, items, labels, orders,
                 config, round_num):
  """The reference round for one user with dense [I, d] tables; `orders`
  is each epoch's visiting order of its examples."""
  d_table, c_table = d_table.astype(np.float64), c_table.astype(np.float64)
  kernel, bias = kernel.astype(np.float64), bias.astype(np.float64)
  tanh = np.tanh(round_num / 10) if config.weight_schedule == 'tanh' else 1.0
  lam, mu = config.lam * tanh, config.mu * tanh
  wd, step = config.weight_decay, 0
  for order in orders:
    for start in range(0, len(order), config.batch_size):
      batch = order[start : start + config.batch_size]
      j, y = items[batch], labels[batch]
      n, d = len(batch), d_table.shape[1]
      vectors = d_table[j] + c_table[j]
      dz = (_sigmoid(vectors @ kernel[:, 0] + bias[0]) - y) / n
      g_kernel = (vectors * dz[:, None]).sum(axis=0)[:, None]
      g_bias = np.array([dz.sum()])
      diff = d_table[j] - c_table[j]
      g_d_rows = dz[:, None] * kernel[:, 0] - 2 * lam * diff / (n * d)
      g_c_rows = (dz[:, None] * kernel[:, 0] + 2 * lam * diff / (n * d)
                  + mu * np.sign(c_table[j]) / (n * d))
      g_d, g_c = np.zeros_like(d_table), np.zeros_like(c_table)
      np.add.at(g_d, j, g_d_rows)
      np.add.at(g_c, j, g_c_rows)
      scale = config.round_lr_decay ** round_num * config.batch_lr_decay ** step
      lr_net = config.learning_rate * scale
      lr_args = config.item_learning_rate * scale
      kernel = kernel - lr_net * (g_kernel + wd * kernel)
      bias = bias - lr_net * (g_bias + wd * bias)
      d_table = d_table - lr_args * (g_d + wd * d_table)
      c_table = c_table - lr_args * (g_c + wd * c_table)
      step += 1
  return d_table, c_table, kernel, bias


def _user(seed, num_examples):
  rng = np.random.default_rng(seed)
  items = rng.integers(0, _NUM_ITEMS, num_examples).astype(np.int32)
  labels = (rng.random(num_examples) < 0.3).astype(np.float32)
  return items, labels


def _tables(seed):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(_NUM_ITEMS, _DIM)).astype(np.float32),
          rng.normal(size=(_NUM_ITEMS, _DIM)).astype(np.float32),
          rng.uniform(-0.5, 0.5, (_DIM, 1)).astype(np.float32),
          rng.uniform(-0.5, 0.5, (1,)).astype(np.float32))


def _orders(num_examples, seed, epochs):
  """The reference code's order of a user's examples in each epoch, as
  the client loop documents it: as given, then reshuffled with seed +
  epoch."""
  return [np.arange(num_examples)] + [
      tf.random.experimental.stateless_shuffle(
          tf.range(num_examples),
          seed=tf.constant(seed, tf.int64) + epoch).numpy()
      for epoch in range(1, epochs)
  ]


def _train(users, d_table, c_table, kernel, bias, config, round_num):
  """The trainer on a group of users: `users` [(items, labels, seed)], each
  on its compact table of the distinct items of its data."""
  row_ids = [np.unique(items) for items, _, _ in users]
  width = max(ids.size for ids in row_ids)
  length = max(items.size for items, _, _ in users)
  padded_ids = np.zeros([len(users), width], np.int32)
  local_items = np.zeros([len(users), length], np.int32)
  labels = np.zeros([len(users), length], np.float32)
  for u, ((items, user_labels, _), ids) in enumerate(zip(users, row_ids)):
    padded_ids[u, : ids.size] = ids
    local_items[u, : items.size] = np.searchsorted(ids, items)
    labels[u, : items.size] = user_labels
  num_users = len(users)
  stack = lambda x: np.repeat(x[None], num_users, axis=0)
  result = local_training.train_users_locally(
      tf.constant(d_table[padded_ids]), tf.constant(c_table[padded_ids]),
      [collections.OrderedDict(kernel=stack(kernel), bias=stack(bias))],
      local_items, labels,
      np.array([items.size for items, _, _ in users], np.int32),
      round_num=round_num,
      shuffle_seeds=np.array([seed for _, _, seed in users], np.int64),
      config=config,
  )
  return result, row_ids


def _dense(compact, ids, table, scale):
  """A user's whole table: its compact rows on `ids`, table x scale
  elsewhere."""
  dense = table * scale
  dense[ids] = compact[: ids.size]
  return dense


@pytest.mark.parametrize('config, round_num', [
    (_CONFIG, 0),
    (_CONFIG, 3),
    (dataclasses.replace(_CONFIG, weight_schedule='tanh'), 4),
])
def test_one_user_matches_the_reference_round(config, round_num):
  d_table, c_table, kernel, bias = _tables(1)
  items, labels = _user(2, 10)  # 3 batches an epoch: 4, 4, 2.
  seed = [5, 6]
  result, (ids,) = _train([(items, labels, seed)], d_table, c_table, kernel,
                          bias, config, round_num)
  want_d, want_c, want_kernel, want_bias = _numpy_round(
      d_table, c_table, kernel, bias, items, labels,
      _orders(10, seed, config.local_epochs), config, round_num,
  )
  scale = float(result.round_row_scale[0])
  np.testing.assert_allclose(
      _dense(result.personal_rows[0].numpy(), ids, d_table, scale), want_d,
      rtol=2e-4, atol=2e-5)
  np.testing.assert_allclose(
      _dense(result.global_rows[0].numpy(), ids, c_table, scale), want_c,
      rtol=2e-4, atol=2e-5)
  layer = result.score_layers[0]
  np.testing.assert_allclose(layer['kernel'][0], want_kernel, rtol=2e-4,
                             atol=1e-6)
  np.testing.assert_allclose(layer['bias'][0], want_bias, rtol=2e-4,
                             atol=1e-6)
  # 9 steps; the untouched rows decayed by prod_k (1 - lr_k wd).
  lrs = [config.item_learning_rate * config.round_lr_decay ** round_num
         * config.batch_lr_decay ** k for k in range(9)]
  assert scale == pytest.approx(np.prod([1 - lr * 0.05 for lr in lrs]),
                                rel=1e-5)
  assert int(result.num_examples[0]) == 30


def test_users_trained_together_train_as_if_alone():
  d_table, c_table, kernel, bias = _tables(3)
  users = [(*_user(4, 10), [1, 2]), (*_user(5, 3), [3, 4]),
           (*_user(6, 7), [5, 6])]
  together, together_ids = _train(users, d_table, c_table, kernel, bias,
                                  _CONFIG, 1)
  for u, user in enumerate(users):
    alone, (ids,) = _train([user], d_table, c_table, kernel, bias, _CONFIG, 1)
    np.testing.assert_array_equal(together_ids[u], ids)
    for key in ('personal_rows', 'global_rows'):
      np.testing.assert_allclose(
          getattr(together, key)[u, : ids.size], getattr(alone, key)[0],
          rtol=1e-5, atol=1e-6)
    for key in ('round_row_scale', 'loss_sum', 'num_examples'):
      np.testing.assert_allclose(getattr(together, key)[u],
                                 getattr(alone, key)[0], rtol=1e-5)
    np.testing.assert_allclose(together.score_layers[0]['kernel'][u],
                               alone.score_layers[0]['kernel'][0], rtol=1e-5)


def test_config_rejects_bad_values():
  with pytest.raises(ValueError, match='batch_size'):
    local_training.FedRAPTrainingConfig(batch_size=0)
  with pytest.raises(ValueError, match='weight_schedule'):
    local_training.FedRAPTrainingConfig(weight_schedule='sin')
