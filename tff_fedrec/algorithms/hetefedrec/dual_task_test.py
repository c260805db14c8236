"""Eq. 11 and Eq. 14 against a hand-written reference, one client at a time."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec.algorithms.hetefedrec import decorrelation
from tff_fedrec.algorithms.hetefedrec import dual_task
from tff_fedrec.algorithms.hetefedrec import models as hetero_models

_SPEC = hetero_models.HeteroSpec(num_items=9, widths=(2, 3, 5),
                                 hidden_units=(4,))


def _mlp(x, layers):
  hidden = x
  for index, layer in enumerate(layers):
    hidden = hidden @ layer['kernel'] + layer['bias']
    if index < len(layers) - 1:
      hidden = tf.nn.relu(hidden)
  return hidden[:, 0]


def _reference_loss(tier, user, table, items, labels, layers, udl,
                    alpha, spec=_SPEC):
  """L'_a for ONE client: sum over b of sum over examples of BCE, written
  with the concatenation [u ; v] explicitly, plus alpha * ||corr||_F / N
  over the rows of the given items.
  For LightGCN u is first averaged with its positives' mean-by-sqrt sum."""
  terms = range(tier + 1) if udl else [tier]
  total = 0.0
  if spec.model == 'lightgcn':
    neighbors = np.unique(items[labels > 0])
    neighbor_sum = tf.reduce_sum(tf.gather(table, neighbors), 0)
    if not spec.neighbor_gradient:
      neighbor_sum = tf.stop_gradient(neighbor_sum)
    user = 0.5 * (user + neighbor_sum / np.sqrt(max(len(neighbors), 1)))
  for b in terms:
    width = _SPEC.widths[b]
    u = tf.tile(user[None, :width], [len(items), 1])
    v = tf.gather(table, items)[:, :width]
    p = tf.sigmoid(_mlp(tf.concat([u, v], 1), layers[b]))
    total += -tf.reduce_sum(
        labels * tf.math.log(p) + (1 - labels) * tf.math.log(1 - p)
    )
  # One row has constant columns: Eq. 13 is 0 there (`decorrelation`).
  if tier > 0 and alpha and len(np.unique(items)) > 1:
    rows = tf.gather(table, np.unique(items))
    z = (rows - tf.reduce_mean(rows, 0)) / tf.math.reduce_std(rows, 0)
    corr = tf.transpose(z) @ z / tf.cast(tf.shape(rows)[0], tf.float32)
    total += alpha * tf.norm(corr) / table.shape[1]
  return total


def _client(seed, tier, n):
  rng = np.random.default_rng(seed)
  width = _SPEC.widths[tier]
  items = rng.integers(0, _SPEC.num_items, n).astype(np.int32)
  labels = (rng.random(n) < 0.4).astype(np.float32)
  table = rng.normal(size=(_SPEC.num_items, width)).astype(np.float32)
  user = rng.normal(size=width).astype(np.float32)
  return user, table, items, labels


def _group(clients):
  """Pads clients into the batched layout of `client_gradients`: (users,
  rows, `ClientExamples`, each client's row ids), tensors but the ids."""
  row_ids = [np.unique(items) for _, _, items, _ in clients]
  t = max(len(r) for r in row_ids)
  n = max(len(items) for _, _, items, _ in clients)
  rows = np.zeros([len(clients), t, clients[0][1].shape[1]], np.float32)
  local = np.zeros([len(clients), n], np.int32)
  labels = np.zeros([len(clients), n], np.float32)
  example_mask = np.zeros([len(clients), n], np.float32)
  row_mask = np.zeros([len(clients), t], np.float32)
  for c, ((_, table, items, y), ids) in enumerate(zip(clients, row_ids)):
    rows[c, : len(ids)] = table[ids]
    row_mask[c, : len(ids)] = 1
    local[c, : len(items)] = np.searchsorted(ids, items)
    labels[c, : len(items)] = y
    example_mask[c, : len(items)] = 1
  users = np.stack([u for u, *_ in clients])
  return (tf.constant(users), tf.constant(rows),
          dual_task.ClientExamples(*_tensors(
              row_mask, local, labels, example_mask)),
          row_ids)


def _tensors(*arrays):
  return tuple(tf.constant(a) for a in arrays)


def _objective(tier, alpha, udl=True, spec=_SPEC):
  return dual_task.TierObjective(
      spec, tier, dual_task=udl, decorrelation_weight=alpha)


_MODELS = {
    'ncf': {'model': 'ncf'},
    'lightgcn': {'model': 'lightgcn'},
    'lightgcn-no-neighbor-gradient': {
        'model': 'lightgcn', 'neighbor_gradient': False,
    },
}


@pytest.mark.parametrize('model', list(_MODELS))
@pytest.mark.parametrize('tier', [0, 1, 2])
@pytest.mark.parametrize('udl, alpha', [(True, 0.7), (False, 0.0),
                                        (True, 0.0)])
def test_gradients_match_the_reference_per_client(tier, udl, alpha, model):
  spec = dataclasses.replace(_SPEC, **_MODELS[model])
  params = hetero_models.initial_parameters(_SPEC, seed=3)
  layers = tf.nest.map_structure(tf.constant, params['score_layers'])
  clients = [_client(10 + c, tier, n) for c, n in enumerate([7, 4])]
  users, rows, examples, row_ids = _group(clients)

  got = dual_task.client_gradients(
      _objective(tier, alpha, udl, spec), users, rows, layers, examples,
  )

  layer_sum = None
  for c, (user, table, items, y) in enumerate(clients):
    user_v, table_v = tf.Variable(user), tf.Variable(table)
    with tf.GradientTape() as tape:
      tape.watch(layers)
      loss = _reference_loss(tier, user_v, table_v, items, y, layers,
                             udl, alpha, spec)
    g_user, g_table, g_layers = tape.gradient(
        loss, (user_v, table_v, layers),
        unconnected_gradients=tf.UnconnectedGradients.ZERO,
    )
    np.testing.assert_allclose(got.user[c], g_user, rtol=1e-4, atol=1e-5)
    ids = row_ids[c]
    np.testing.assert_allclose(
        got.item_rows[c, : len(ids)], tf.convert_to_tensor(g_table).numpy()[ids],
        rtol=1e-4, atol=1e-5,
    )
    # Padding rows get no gradient.
    assert not np.any(got.item_rows[c, len(ids):])
    layer_sum = g_layers if layer_sum is None else tf.nest.map_structure(
        tf.add, layer_sum, g_layers)
  # The scorers' gradients are summed over the clients (Eq. 15).
  tf.nest.map_structure(
      lambda g, e: np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5),
      got.score_layers, layer_sum,
  )
  trained = dual_task.tier_terms(tier, udl)
  for b in range(3):
    moved = any(np.any(leaf != 0) for leaf in tf.nest.flatten(
        got.score_layers[b]))
    assert moved == (b in trained)
  assert float(got.num_examples) == 11.0


def test_without_the_neighbor_gradient_only_candidates_move_items():
  """Fed-LightGCN with `neighbor_gradient=False`: the user's positive (a
  neighbour in u' and a candidate) loses the neighbour part of its
  gradient; the negatives (candidates only) and the loss do not change."""
  user, table, _, _ = _client(4, 0, 1)
  items = np.array([[0, 1, 2]], np.int32)
  labels = np.array([[1.0, 0.0, 0.0]], np.float32)
  rows = tf.constant(table[None, :3])
  layers = tf.nest.map_structure(
      tf.constant, hetero_models.initial_parameters(_SPEC, 3)['score_layers']
  )
  results = {}
  for gradient in (True, False):
    spec = dataclasses.replace(
        _SPEC, model='lightgcn', neighbor_gradient=gradient
    )
    arguments = (
        _objective(0, 0.0, udl=False, spec=spec),
        tf.constant(user[None]), rows, layers,
        dual_task.ClientExamples(
            tf.ones([1, 3]), tf.constant(items), tf.constant(labels),
            tf.ones([1, 3])),
    )
    results[gradient] = (
        dual_task.client_gradients(*arguments).item_rows[0],
        dual_task.client_losses(*arguments).total,
    )
  (with_gradient, loss), (without, same_loss) = results[True], results[False]
  np.testing.assert_allclose(loss, same_loss)
  assert not np.allclose(with_gradient[0], without[0], atol=1e-6)
  np.testing.assert_allclose(with_gradient[1:], without[1:], rtol=1e-6)
  assert np.all(np.any(without != 0, axis=-1))


def test_neighbor_gradient_is_a_lightgcn_option_only():
  with pytest.raises(ValueError, match='lightgcn'):
    hetero_models.HeteroSpec(num_items=3, neighbor_gradient=False)


def test_dual_task_trains_the_small_prefix_of_a_large_client():
  # Without UDL a large client's loss does not involve Theta_s at all; with
  # it, Theta_s gets a gradient through V_l[:, :N_s] and u[:N_s].
  assert dual_task.tier_terms(2, True) == (0, 1, 2)
  assert dual_task.tier_terms(2, False) == (2,)
  assert dual_task.tier_terms(0, True) == (0,)


def _reference_local_adam(tier, client, layers, lr, epochs):
  """One client's own Adam from zero moments, `epochs` full-batch steps of
  the reference loss on (u, its table, its copy of the scorers), written out
  in numpy; returns (new u, new table, new scorers)."""
  return _reference_adam_epochs(tier, client, layers, lr, epochs)[-1]


def _reference_adam_epochs(tier, client, layers, lr, epochs, alpha=0.7,
                           batches=None):
  """`_reference_local_adam`'s parameters after each of its epochs; with
  `batches(epoch)`, a list of index arrays into the client's examples, one
  step per batch instead of one per epoch."""
  user, table, items, labels = client
  batches = batches or (lambda epoch: [np.arange(len(items))])
  history = []
  params = [user.astype(np.float64), table.astype(np.float64),
            [tf.nest.map_structure(lambda x: np.array(x, np.float64), l)
             for l in layers]]
  flat = tf.nest.flatten(params)
  m = [np.zeros_like(x) for x in flat]
  v = [np.zeros_like(x) for x in flat]
  step = 0
  for epoch in range(1, epochs + 1):
    for batch in batches(epoch):
      step += 1
      variables = [tf.Variable(tf.constant(x, tf.float32)) for x in flat]
      current = tf.nest.pack_sequence_as(params, variables)
      with tf.GradientTape() as tape:
        loss = _reference_loss(tier, current[0], current[1], items[batch],
                               labels[batch], current[2], True, alpha)
      grads = tape.gradient(
          loss, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
      for k, g in enumerate(grads):
        g = tf.convert_to_tensor(g).numpy().astype(np.float64)
        m[k] = 0.9 * m[k] + 0.1 * g
        v[k] = 0.999 * v[k] + 0.001 * g * g
        flat[k] = flat[k] - lr * (m[k] / (1 - 0.9**step)) / (
            np.sqrt(v[k] / (1 - 0.999**step)) + 1e-8)
    history.append(tf.nest.pack_sequence_as(params, list(flat)))
  return history


@pytest.mark.parametrize('tier', [0, 2])
@pytest.mark.parametrize('epochs', [1, 3])
def test_local_adam_changes_match_each_clients_own_adam(tier, epochs):
  params = hetero_models.initial_parameters(_SPEC, seed=3)
  layers = tf.nest.map_structure(tf.constant, params['score_layers'])
  clients = [_client(20 + c, tier, n) for c, n in enumerate([7, 4, 5])]
  users, rows, examples, row_ids = _group(clients)
  lr = 0.01

  got = dual_task.local_adam_changes(
      _objective(tier, 0.7), users, rows, layers, examples,
      learning_rate=lr, local_epochs=epochs,
  )

  layer_change_sum = None
  for c, client in enumerate(clients):
    new_user, new_table, new_layers = _reference_local_adam(
        tier, client, layers, lr, epochs)
    np.testing.assert_allclose(got.user[c], new_user, rtol=1e-4, atol=1e-5)
    ids = row_ids[c]
    np.testing.assert_allclose(
        got.item_rows[c, : len(ids)], client[1][ids] - new_table[ids],
        rtol=1e-3, atol=1e-6,
    )
    assert not np.any(got.item_rows[c, len(ids):])
    change = tf.nest.map_structure(
        lambda old, new: np.asarray(old, np.float64) - new, layers, new_layers)
    layer_change_sum = change if layer_change_sum is None else (
        tf.nest.map_structure(np.add, layer_change_sum, change))
  tf.nest.map_structure(
      lambda g, e: np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-6),
      got.score_layers, layer_change_sum,
  )
  if epochs == 1:
    # A fresh Adam's first step moves every trained coordinate by lr.
    moved = np.abs(got.item_rows.numpy()[examples.row_mask.numpy() > 0])
    np.testing.assert_allclose(moved[moved > 0], lr, rtol=1e-3)
  # The reported loss is Eq. 2 at the downloaded parameters.
  before = dual_task.client_gradients(
      _objective(tier, 0.7), users, rows, layers, examples)
  np.testing.assert_allclose(got.loss_sum, before.loss_sum, rtol=1e-6)
  # Without a validation split every client keeps its last epoch.
  np.testing.assert_array_equal(got.kept_epoch, [epochs] * len(clients))


def test_a_validation_split_keeps_each_clients_best_epoch():
  # Sec. V.A: a held-out 10% of a client's data guides its local training.
  # Each client keeps the epoch (of 1..L) whose parameters give the lowest
  # Eq. 2 loss under its own scorer on its held-out examples.
  tier, epochs, lr = 1, 4, 0.3
  params = hetero_models.initial_parameters(_SPEC, seed=3)
  layers = tf.nest.map_structure(tf.constant, params['score_layers'])
  sizes = [9, 8, 10, 6, 7]
  clients = [_client(40 + c, tier, n) for c, n in enumerate(sizes)]
  users, rows, examples, row_ids = _group(clients)
  held_out = np.zeros(examples.example_mask.shape, np.float32)
  for c, n in enumerate(sizes[:-1]):  # The last client holds out nothing.
    held_out[c, n - 3 : n] = 1.0

  got = dual_task.local_adam_changes(
      _objective(tier, 0.0), users, rows, layers,
      examples._replace(example_mask=examples.example_mask - held_out),
      learning_rate=lr, local_epochs=epochs,
      validation_mask=tf.constant(held_out),
  )

  chosen = []
  for c, (user, table, items, y) in enumerate(clients):
    train = held_out[c, : len(items)] == 0
    history = _reference_adam_epochs(
        tier, (user, table, items[train], y[train]), layers, lr, epochs,
        alpha=0.0)
    if train.all():
      best = epochs - 1
    else:
      losses = [
          float(_reference_loss(
              tier, tf.constant(h[0], tf.float32),
              tf.constant(h[1], tf.float32), items[~train], y[~train],
              tf.nest.map_structure(lambda x: tf.constant(x, tf.float32),
                                    h[2]),
              False, 0.0))
          for h in history
      ]
      best = len(losses) - 1 - int(np.argmin(losses[::-1]))
    chosen.append(best)
    new_user, new_table, _ = history[best]
    np.testing.assert_allclose(got.user[c], new_user, rtol=1e-4, atol=1e-4)
    ids = row_ids[c]
    np.testing.assert_allclose(
        got.item_rows[c, : len(ids)], table[ids] - new_table[ids],
        rtol=1e-3, atol=1e-4,
    )
  # The case is one where early stopping matters: some client stops early.
  assert min(chosen) < epochs - 1 and chosen[-1] == epochs - 1
  # Each client reports the epoch it kept, counted from 1.
  np.testing.assert_array_equal(got.kept_epoch, np.add(chosen, 1))


def _client_batches(seed, n, batch_size):
  """Client's batches of each epoch, from its own keys: the argsort of
  `stateless_uniform([n], fold_in(seed, epoch))`, B at a time."""
  def batches(epoch):
    keys = tf.random.stateless_uniform(
        [n], tf.random.experimental.stateless_fold_in(
            tf.constant(seed, tf.int64), epoch)).numpy()
    order = np.argsort(keys, kind='stable')
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]
  return batches


@pytest.mark.parametrize('tier', [0, 2])
def test_minibatch_epochs_match_each_clients_own_adam(tier):
  # Clients of 7, 4 and 5 examples in batches of 3 take 3, 2 and 2 steps
  # an epoch: the second waits at the group's third step, and its Adam's
  # bias correction counts its own steps only. Each client is written out
  # alone (its keys drawn for its own n, not the group's padded width), so
  # this also checks that its order ignores the rest of its group.
  params = hetero_models.initial_parameters(_SPEC, seed=3)
  layers = tf.nest.map_structure(tf.constant, params['score_layers'])
  sizes, batch_size, epochs, lr = [7, 4, 5], 3, 2, 0.01
  clients = [_client(60 + c, tier, n) for c, n in enumerate(sizes)]
  seeds = np.array([[5, c] for c in range(len(sizes))], np.int64)
  users, rows, examples, row_ids = _group(clients)
  arguments = (_objective(tier, 0.7), users, rows, layers, examples)

  got = dual_task.local_adam_changes(
      *arguments, learning_rate=lr, local_epochs=epochs,
      batch_size=batch_size, seeds=tf.constant(seeds),
  )

  for c, client in enumerate(clients):
    new_user, new_table, _ = _reference_adam_epochs(
        tier, client, layers, lr, epochs,
        batches=_client_batches(seeds[c], sizes[c], batch_size))[-1]
    np.testing.assert_allclose(got.user[c], new_user, rtol=1e-4, atol=1e-5)
    ids = row_ids[c]
    np.testing.assert_allclose(
        got.item_rows[c, : len(ids)], client[1][ids] - new_table[ids],
        rtol=1e-3, atol=1e-6,
    )
  # Minibatches differ from one full-batch step per epoch.
  full = dual_task.local_adam_changes(
      *arguments, learning_rate=lr, local_epochs=epochs)
  assert not np.allclose(got.user, full.user, atol=1e-4)


def test_distinct_rows_are_each_batch_item_once():
  # Client 0's batch repeats row 3 (a negative drawn twice) and masks out
  # row 5; client 1 has no example in the batch.
  items = np.array([[3, 1, 3, 5, 0], [2, 2, 4, 1, 0]], np.int32)
  mask = np.array([[1, 1, 1, 0, 1], [0, 0, 0, 0, 0]], np.float32)

  indices, first = dual_task.distinct_rows(*_tensors(items, mask))

  for c in range(2):
    chosen = np.asarray(indices[c])[np.asarray(first[c]) > 0]
    np.testing.assert_array_equal(chosen, np.unique(items[c][mask[c] > 0]))
  # Eq. 13 over the gathered rows is Eq. 13 over the client's rows masked
  # to the batch's items (a repeated row counted twice would change it).
  rng = np.random.default_rng(0)
  rows = rng.normal(size=(2, 6, 4)).astype(np.float32)
  rows[0, 3] *= 5.0
  batch_rows = np.zeros([2, 6], np.float32)
  for c in range(2):
    batch_rows[c, items[c][mask[c] > 0]] = 1.0
  np.testing.assert_allclose(
      decorrelation.decorrelation_loss(
          tf.gather(rows, indices, batch_dims=1), first),
      decorrelation.decorrelation_loss(rows, batch_rows), rtol=1e-6,
  )


@pytest.mark.parametrize('model', ['ncf', 'lightgcn'])
def test_one_batch_as_large_as_the_data_is_the_full_batch_step(model):
  # B >= every client's n: one step an epoch on all of its examples, in a
  # shuffled order, which a sum does not see. Fed-LightGCN's graph is the
  # whole local graph either way.
  spec = dataclasses.replace(_SPEC, **_MODELS[model])
  params = hetero_models.initial_parameters(spec, seed=3)
  layers = tf.nest.map_structure(tf.constant, params['score_layers'])
  clients = [_client(80 + c, 1, n) for c, n in enumerate([6, 9])]
  users, rows, examples, _ = _group(clients)
  arguments = (_objective(1, 0.7, spec=spec), users, rows, layers, examples)
  options = dict(learning_rate=0.01, local_epochs=3)
  full = dual_task.local_adam_changes(*arguments, **options)
  one_batch = dual_task.local_adam_changes(
      *arguments, **options, batch_size=9,
      seeds=tf.constant([[1, 2], [3, 4]], tf.int64),
  )
  tf.nest.map_structure(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
      (full.user, full.item_rows, full.score_layers, full.loss_sum),
      (one_batch.user, one_batch.item_rows, one_batch.score_layers,
       one_batch.loss_sum),
  )


def test_minibatches_need_seeds():
  params = hetero_models.initial_parameters(_SPEC, seed=3)
  users, rows, examples, _ = _group([_client(1, 0, 4)])
  with pytest.raises(ValueError, match='seeds'):
    dual_task.local_adam_changes(
        _objective(0, 0.0), users, rows, params['score_layers'], examples,
        learning_rate=0.01, local_epochs=1, batch_size=2,
    )
