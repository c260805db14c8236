"""One HeteFedRec round in TFF against the same round written out by hand."""

import collections
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec import tier_codecs
from tff_fedrec.algorithms.hetefedrec import dual_task
from tff_fedrec.algorithms.hetefedrec import models as hetero_models
from tff_fedrec.algorithms.hetefedrec import process as hetefedrec
from tff_fedrec.algorithms.hetefedrec import tiered_method
from tff_fedrec.programs import execution

_SPEC = hetero_models.HeteroSpec(num_items=12, widths=(2, 3, 5),
                                 hidden_units=(4,))
_NO_DISTILLATION = hetefedrec.HeteroConfig(
    learning_rate=0.01, decorrelation_weight=0.5, distillation_items=0
)

_Built = collections.namedtuple(
    '_Built', ['process', 'config', 'initial_parameters'])


def _build(config):
  params = hetero_models.initial_parameters(_SPEC, seed=0)
  return _Built(hetefedrec.build_hetefedrec_process(_SPEC, params, config),
                config, params)


@pytest.fixture(scope='module', autouse=True)
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


def _user(seed, n, held_out=0):
  """A user of n examples, the last `held_out` of them held out."""
  rng = np.random.default_rng(seed)
  return collections.OrderedDict(
      items=rng.integers(0, _SPEC.num_items, n).astype(np.int32),
      labels=(rng.random(n) < 0.4).astype(np.float32),
      validation=(np.arange(n) >= n - held_out).astype(np.float32),
      seed=np.array([seed, 7], np.int64),
  )


def _group(tier, users, include=1.0):
  return hetefedrec.group_client_data(users, tier=tier, include=include)


def _locals(num_users, tier, seed):
  users = np.random.default_rng(seed).normal(
      scale=0.1, size=(num_users, _SPEC.widths[-1])
  ).astype(np.float32)
  users[:, _SPEC.widths[tier]:] = 0.0
  return collections.OrderedDict(
      user=users, adam_m=np.zeros_like(users), adam_v=np.zeros_like(users),
      adam_step=np.zeros([num_users], np.float32),
  )


def _round(method, groups, locals_in):
  state = method.process.initialize()
  return state, *method.process.next(state, locals_in, groups)


def _mean_kept_epoch(metrics):
  client = metrics['client_work']
  return client['kept_epoch_sum'] / client['trained_users']


def _first_adam_step(x, g, lr):
  """Adam's first step from zero moments: lr * g / (|g| + eps)."""
  return x - lr * g / (np.abs(g) + 1e-8)


def _expected_round(method, groups, locals_in):
  """Client gradients (`dual_task`, tested against its own
  reference), padded sums (Eq. 8), per-tier scorer sums (Eq. 15), one Adam
  step from zero state; with change_aggregation 'mean', each sum divided by
  its contributors, counted here user by user; with 'fedavg', each table
  column divided by every user whose model holds it, trained row or not."""
  params = tf.nest.map_structure(tf.constant, method.initial_parameters)
  table_sums = [np.zeros(t.shape, np.float32) for t in params['item_tables']]
  table_counts = [np.zeros(t.shape, np.float32)
                  for t in params['item_tables']]
  layer_counts = np.zeros([3], np.float32)
  layer_sums = tf.nest.map_structure(np.zeros_like, method.initial_parameters[
      'score_layers'])
  users_out = []
  kept_epoch_sum = trained_users = 0.0
  for data, local in zip(groups, locals_in):
    tier = int(data['tier'])
    width = _SPEC.widths[tier]
    rows = tf.gather(params['item_tables'][tier], data['row_ids'])
    t, n = data['row_ids'].shape[1], data['items'].shape[1]
    row_mask = (np.arange(t) < data['num_rows'][:, None]).astype(np.float32)
    example_mask = (np.arange(n) < data['num_examples'][:, None]).astype(
        np.float32) * (1 - data['validation'])
    local_adam = method.config.update_rule == 'local_adam'
    arguments = (
        dual_task.TierObjective(
            _SPEC, tier, dual_task=method.config.dual_task,
            decorrelation_weight=method.config.decorrelation_weight),
        tf.constant(local['user'][:, :width]), rows, params['score_layers'],
        dual_task.ClientExamples(
            tf.constant(row_mask), tf.constant(data['items']),
            tf.constant(data['labels']), tf.constant(example_mask)))
    if local_adam:  # Uploads are the clients' changes (tested on their own).
      grads = dual_task.local_adam_changes(
          *arguments, learning_rate=method.config.learning_rate,
          local_epochs=method.config.local_epochs,
          validation_mask=(tf.constant(data['validation'])
                           if method.config.validation_fraction else None),
          batch_size=method.config.local_batch_size,
          seeds=tf.constant(data['seeds']))
      kept_epoch_sum += data['include'] * float(np.sum(grads.kept_epoch))
    else:
      grads = dual_task.client_gradients(*arguments)
    trained_users += data['include'] * len(data['num_rows'])
    table_grad = np.zeros([_SPEC.num_items, width], np.float32)
    for u in range(len(data['num_rows'])):
      ids = data['row_ids'][u, : data['num_rows'][u]]
      np.add.at(table_grad, ids, grads.item_rows.numpy()[u, : len(ids)])
      held = (slice(None) if method.config.change_aggregation == 'fedavg'
              else ids)
      for target, w in enumerate(_SPEC.widths):
        if method.config.aggregation == 'padded' or target == tier:
          table_counts[target][held, : min(w, width)] += data['include']
      for term in dual_task.tier_terms(
          tier, method.config.dual_task):
        layer_counts[term] += data['include']
    table_grad *= data['include']
    padded = np.zeros([_SPEC.num_items, _SPEC.widths[-1]], np.float32)
    padded[:, :width] = table_grad
    for target, w in enumerate(_SPEC.widths):
      if method.config.aggregation == 'padded':
        table_sums[target] += padded[:, :w]
      elif target == tier:
        table_sums[target] += table_grad
    layer_sums = tf.nest.map_structure(
        lambda s, g: s + data['include'] * g.numpy(), layer_sums,
        grads.score_layers)
    user = local['user'].copy()
    if local_adam:
      user[:, :width] = grads.user.numpy()
    elif method.config.user_optimizer == 'adam':
      user[:, :width] = _first_adam_step(
          user[:, :width], grads.user.numpy(),
          method.config.user_learning_rate)
    else:  # Eq. 3.
      user[:, :width] -= method.config.user_learning_rate * grads.user.numpy()
    users_out.append(user)
  lr = method.config.learning_rate
  if method.config.change_aggregation in ('mean', 'fedavg'):
    table_sums = [s / np.maximum(c, 1) for s, c in zip(table_sums,
                                                       table_counts)]
    layer_sums = [tf.nest.map_structure(lambda x, c=c: x / max(c, 1), layer)
                  for layer, c in zip(layer_sums, layer_counts)]
  if method.config.update_rule == 'local_adam':
    # Eq. 4 / 9 / 15: the server adds the clients' summed changes.
    step = lambda x, change: x - change
  else:
    step = lambda x, g: _first_adam_step(x, g, lr)
  tables = [step(t, g)
            for t, g in zip(method.initial_parameters['item_tables'],
                            table_sums)]
  layers = tf.nest.map_structure(
      step, method.initial_parameters['score_layers'], layer_sums)
  return tables, layers, users_out, kept_epoch_sum / trained_users


def _setup(held_out=0):
  # Two small clients in one TFF client, one large client; no medium client.
  # With `held_out`, the first and the large client hold out examples.
  groups = [
      _group(0, [_user(1, 6, held_out), _user(2, 3)]),
      _group(2, [_user(3, 9, held_out)]),
  ]
  locals_in = [_locals(2, 0, seed=4), _locals(1, 2, seed=5)]
  return groups, locals_in


# Each code path of the round at least once: padded / clustered tables, UDL
# on / off, SGD / Adam user steps, server Adam / local Adam, the sum / mean /
# fedavg of changes (mean and fedavg on padded and clustered tables), a
# validation split and minibatches.
@pytest.mark.parametrize('config', [
    _NO_DISTILLATION,
    dataclasses.replace(_NO_DISTILLATION, dual_task=False),
    dataclasses.replace(_NO_DISTILLATION, aggregation='clustered',
                        dual_task=False, decorrelation_weight=0.0),
    dataclasses.replace(_NO_DISTILLATION, user_optimizer='adam',
                        user_learning_rate=0.02),
    dataclasses.replace(_NO_DISTILLATION, update_rule='local_adam',
                        local_epochs=2),
    dataclasses.replace(_NO_DISTILLATION, update_rule='local_adam',
                        local_epochs=3, validation_fraction=0.1,
                        change_aggregation='mean', learning_rate=0.2),
    dataclasses.replace(_NO_DISTILLATION, update_rule='local_adam',
                        aggregation='clustered', dual_task=False,
                        change_aggregation='mean'),
    dataclasses.replace(_NO_DISTILLATION, update_rule='local_adam',
                        aggregation='clustered', dual_task=False,
                        change_aggregation='fedavg'),
    dataclasses.replace(_NO_DISTILLATION, update_rule='local_adam',
                        local_epochs=2, local_batch_size=2,
                        validation_fraction=0.1, change_aggregation='fedavg'),
], ids=['hetefedrec', 'no_udl', 'clustered', 'adam_users', 'local_adam',
        'local_adam_validated_mean', 'local_adam_mean_clustered_no_udl',
        'local_adam_fedavg_clustered',
        'local_adam_minibatch_validated_fedavg'])
def test_one_round_matches_the_round_written_out(config):
  method = _build(config)
  groups, locals_in = _setup(
      held_out=3 if config.validation_fraction else 0)

  _, state, locals_out, metrics = _round(method, groups, locals_in)

  tables, layers, users, mean_kept_epoch = _expected_round(
      method, groups, locals_in)
  got = state['global_parameters']
  for got_table, want in zip(got['item_tables'], tables):
    np.testing.assert_allclose(got_table, want, rtol=1e-5, atol=1e-6)
  tf.nest.map_structure(
      lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6),
      tf.nest.map_structure(np.asarray, list(got['score_layers'])),
      layers,
  )
  for local, want in zip(locals_out, users):
    np.testing.assert_allclose(local['user'], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(
        local['adam_step'],
        np.full(len(want), config.user_optimizer == 'adam', np.float32))
  assert int(state['round_num']) == 1
  held_out = sum(np.sum(g['validation']) for g in groups)
  assert float(metrics['num_examples']) == 18.0 - held_out
  # The local epoch each user kept, averaged over users (0 without local
  # training).
  np.testing.assert_allclose(_mean_kept_epoch(metrics), mean_kept_epoch,
                             rtol=1e-6)
  if config.update_rule == 'local_adam' and not config.validation_fraction:
    assert float(_mean_kept_epoch(metrics)) == config.local_epochs
  if config.aggregation == 'padded':
    np.testing.assert_array_equal(
        metrics['aggregator']['clients_per_width'], [1, 0, 1])


def test_padded_aggregation_keeps_the_shared_prefixes_equal():
  # Eq. 10: without distillation the tables stay equal on their prefixes,
  # also with no medium client in the round.
  method = _build(_NO_DISTILLATION)
  groups, locals_in = _setup()
  _, state, *_ = _round(method, groups, locals_in)
  small, medium, large = (np.asarray(t)
                          for t in state['global_parameters']['item_tables'])
  np.testing.assert_allclose(medium[:, :2], small, atol=1e-7)
  np.testing.assert_allclose(large[:, :3], medium, atol=1e-7)
  assert not np.allclose(
      small, method.initial_parameters['item_tables'][0], atol=1e-6)


def test_excluded_clients_do_not_move_the_public_parameters():
  method = _build(tiered_method.plain_config(_NO_DISTILLATION))
  groups = [_group(2, [_user(1, 6)], include=0.0)]
  locals_in = [_locals(1, 2, seed=4)]
  _, state, locals_out, _ = _round(method, groups, locals_in)
  for got, initial in zip(state['global_parameters']['item_tables'],
                          method.initial_parameters['item_tables']):
    np.testing.assert_array_equal(got, initial)
  # The excluded client still trains its own embedding.
  assert not np.allclose(locals_out[0]['user'], locals_in[0]['user'])


def test_distillation_lowers_its_loss_and_breaks_only_the_ties_it_should():
  config = dataclasses.replace(
      _NO_DISTILLATION, distillation_items=6, distillation_learning_rate=0.001)
  method = _build(config)
  groups, locals_in = _setup()
  _, state, _, metrics = _round(method, groups, locals_in)
  distillation = metrics['finalizer']['distillation']
  before = np.asarray(distillation['loss_before'])
  after = np.asarray(distillation['loss_after'])
  assert np.all(after <= before) and np.sum(after) < np.sum(before)
  no_kd = _build(_NO_DISTILLATION)
  _, plain, *_ = _round(no_kd, groups, locals_in)
  changed = [
      np.any(np.abs(np.asarray(a) - np.asarray(b)) > 1e-7, axis=1)
      for a, b in zip(state['global_parameters']['item_tables'],
                      plain['global_parameters']['item_tables'])
  ]
  # Exactly the 6 distilled items' rows moved, in at least one table.
  assert np.count_nonzero(np.any(changed, axis=0)) <= 6
  assert np.any(changed)


@pytest.mark.parametrize('changes, message', [
    (dict(update_rule='client_sgd'), 'update_rule must be one of'),
    (dict(update_rule='local_adam', local_epochs=0), 'local_epochs must be'),
    (dict(local_epochs=2), 'local_epochs applies to update_rule="local_adam"'),
    (dict(validation_fraction=0.1), 'apply to update_rule="local_adam" only'),
    (dict(change_aggregation='mean'), 'apply to update_rule="local_adam" only'),
    (dict(update_rule='local_adam', change_aggregation='median'),
     'change_aggregation must be one of'),
    (dict(local_batch_size=64), 'apply to update_rule="local_adam" only'),
    (dict(update_rule='local_adam', local_batch_size=-1),
     'local_batch_size must be >= 0'),
    (dict(update_rule='local_adam', validation_fraction=1.0),
     r'validation_fraction must be in \[0, 1\)'),
])
def test_inconsistent_update_rules_are_refused(changes, message):
  with pytest.raises(ValueError, match=message):
    dataclasses.replace(_NO_DISTILLATION, **changes)


def _client_upload(config, codecs, tier, users, upload_tier=0):
  params = hetero_models.initial_parameters(_SPEC, seed=0)
  work = hetefedrec.build_client_work(_SPEC, params, config, codecs)
  data = _group(tier, users)
  if codecs is not None:
    data['upload_tier'] = np.int32(upload_tier)
  received = collections.OrderedDict(global_parameters=params, round_num=0)
  _, upload = work.client_update(received, _locals(len(users), tier, 1),
                                 data)
  return upload


@pytest.mark.parametrize('update_rule', ['server_adam', 'local_adam'])
def test_each_users_message_is_encoded_by_its_device_tier(update_rule):
  config = dataclasses.replace(_NO_DISTILLATION, update_rule=update_rule)
  users = [_user(1, 6), _user(2, 9)]
  plain = _client_upload(config, None, 2, users)
  # Untouched codecs: the users' own scorer changes add up to the shared
  # ones (a per-user copy of Theta_b each).
  untouched = _client_upload(config, (tier_codecs.UpdateCodec(),) * 3, 2,
                             users, upload_tier=1)
  for a, b in zip(tf.nest.flatten(plain['update']),
                  tf.nest.flatten(untouched['update'])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
  # One user on 1 bit: each tensor of its message is its min and max.
  alone = [users[0]]
  exact = _client_upload(config, None, 2, alone)
  coded = _client_upload(config, (tier_codecs.UpdateCodec('quant', 1),) * 3,
                         2, alone, upload_tier=0)
  table, exact_table = (np.asarray(coded['update']['tables']),
                        np.asarray(exact['update']['tables']))
  rows = np.unique(alone[0]['items'])
  # The scorers Theta_b tier 2 trains (b <= 2 under UDL).
  terms = dual_task.tier_terms(2, config.dual_task)
  exact_layers = [np.asarray(x) for b in terms for x in tf.nest.flatten(
      exact['update']['score_layers'][b])]
  coded_layers = [np.asarray(x) for b in terms for x in tf.nest.flatten(
      coded['update']['score_layers'][b])]
  for coded_part, exact_part in [(table[rows], exact_table[rows]),
                                 *zip(coded_layers, exact_layers)]:
    gaps = np.abs(coded_part.ravel()[:, None]
                  - np.array([exact_part.min(), exact_part.max()])[None])
    assert np.all(gaps.min(axis=1) < 1e-5)
  untrained = np.setdiff1d(np.arange(_SPEC.num_items), rows)
  np.testing.assert_array_equal(table[untrained], 0.0)
  # Messages of the real rows (a row per item, width 5) and of the scorers
  # tier 2 trains: ceil(n / 8) + 8 bytes a tensor.
  expected = sum(np.ceil(n / 8) + 8 for n in
                 [rows.size * _SPEC.widths[2]]
                 + [x.size for x in exact_layers])
  np.testing.assert_array_equal(coded['metrics']['tier_upload_bytes'],
                                [expected, 0, 0])
  np.testing.assert_array_equal(coded['metrics']['tier_users'], [1, 0, 0])
