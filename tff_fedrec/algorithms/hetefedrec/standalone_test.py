"""Standalone rounds in TFF against each user's Adam step written out."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec.algorithms.hetefedrec import models as hetero_models
from tff_fedrec.algorithms.hetefedrec import process as hetefedrec
from tff_fedrec.algorithms.hetefedrec import standalone
from tff_fedrec.programs import execution

_LR = 0.01


@pytest.fixture(scope='module', autouse=True)
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


def _user_data(seed, n, num_items):
  rng = np.random.default_rng(seed)
  return collections.OrderedDict(
      items=rng.choice(num_items, n, replace=False).astype(np.int32),
      labels=(rng.random(n) < 0.5).astype(np.float32),
  )


def _group(tier, users):
  return hetefedrec.group_client_data(users, tier=tier)


_Built = collections.namedtuple('_Built', ['process', 'initial_parameters'])


def _build(spec):
  return _Built(standalone.build_standalone_process(spec, _LR),
                hetero_models.initial_parameters(spec, seed=0))


def _models(spec, method, tier, num_users, seed):
  users = np.random.default_rng(seed).normal(
      scale=0.1, size=(num_users, spec.widths[-1])
  ).astype(np.float32)
  return standalone.initial_personal_models(
      spec, method.initial_parameters, tier=tier, user_embeddings=users
  )


def _user_slice(models, u):
  return tf.nest.map_structure(lambda x: x[u], models)


def _expected_user_step(spec, model, data):
  """One user's Eq. 2 gradient (own tier, no UDL / DDR) and Adam's first
  step from zero moments, x - lr * g / (|g| + eps)."""
  variables = tf.nest.map_structure(tf.constant, model)
  with tf.GradientTape() as tape:
    tape.watch(variables)
    user = variables['user']
    vectors = tf.gather(variables['item_table'], data['items'])
    if spec.model == 'lightgcn':
      positives = data['items'][data['labels'] > 0]
      neighbor_sum = tf.reduce_sum(
          tf.gather(variables['item_table'], np.unique(positives)), 0
      )
      user = hetero_models.user_representation(
          spec, user, neighbor_sum, np.unique(positives).size
      )
    logits = hetero_models.logits(user, vectors, variables['score_layers'])
    loss = tf.reduce_sum(
        tf.nn.sigmoid_cross_entropy_with_logits(
            labels=data['labels'], logits=logits
        )
    )
  grads = tf.nest.map_structure(
      lambda g: tf.convert_to_tensor(g).numpy(),
      tape.gradient(loss, variables),
  )
  return tf.nest.map_structure(
      lambda x, g: x - _LR * g / (np.abs(g) + 1e-8),
      model, grads,
  ), float(loss)


@pytest.mark.parametrize('model_name', ['ncf', 'lightgcn'])
def test_each_user_takes_its_own_adam_step_on_its_own_model(model_name):
  spec = hetero_models.HeteroSpec(
      num_items=10, widths=(2, 3, 5), hidden_units=(4,), model=model_name
  )
  method = _build(spec)
  tier = 1
  data = [_user_data(s, n, spec.num_items) for s, n in ((0, 6), (1, 4))]
  locals_in = _models(spec, method, tier, 2, seed=3)
  # The users start from the same tier model; make the second one differ so
  # that mixing the users up would show.
  locals_in['model']['item_table'][1] *= 2.0
  state = method.process.initialize()
  state, locals_out, metrics = method.process.next(
      state, [locals_in], [_group(tier, data)]
  )
  assert state['round_num'] == 1
  assert list(state['global_parameters']) == []  # Nothing is shared.
  loss_sum = 0.0
  for u in range(2):
    expected, loss = _expected_user_step(
        spec, _user_slice(locals_in['model'], u), data[u]
    )
    loss_sum += loss
    tf.nest.map_structure(
        lambda got, want: np.testing.assert_allclose(
            got, want, rtol=1e-5, atol=1e-6
        ),
        _user_slice(locals_out[0]['model'], u), expected,
    )
  np.testing.assert_allclose(locals_out[0]['adam_step'], [1.0, 1.0])
  np.testing.assert_allclose(metrics['train_loss'], loss_sum / 10, rtol=1e-5)
  # Items in nobody's data keep their initial rows.
  untouched = np.setdiff1d(np.arange(10), data[0]['items'])
  np.testing.assert_array_equal(
      locals_out[0]['model']['item_table'][0][untouched],
      locals_in['model']['item_table'][0][untouched],
  )


def test_a_second_round_continues_from_the_adam_state():
  spec = hetero_models.HeteroSpec(num_items=8, widths=(2, 3, 4),
                                  hidden_units=(3,))
  method = _build(spec)
  group = [_group(0, [_user_data(5, 5, spec.num_items)])]
  state = method.process.initialize()
  locals_in = [_models(spec, method, 0, 1, seed=1)]
  state, first, _ = method.process.next(state, locals_in, group)
  state, second, _ = method.process.next(state, first, group)
  assert second[0]['adam_step'][0] == 2.0
  # The second step's m is 0.9 m_1 + 0.1 g_2, so it is not a fresh first step:
  # re-running round one from the round-one output with zeroed moments moves
  # the model differently.
  fresh = tf.nest.map_structure(np.array, first[0])
  fresh['adam_m'] = tf.nest.map_structure(np.zeros_like, fresh['adam_m'])
  fresh['adam_v'] = tf.nest.map_structure(np.zeros_like, fresh['adam_v'])
  fresh['adam_step'][:] = 0.0
  _, restarted, _ = method.process.next(state, [fresh], group)
  assert not np.allclose(
      second[0]['model']['user'], restarted[0]['model']['user']
  )


def test_initial_models_copy_the_tier_model_for_every_user():
  spec = hetero_models.HeteroSpec(num_items=5, widths=(2, 4, 8))
  params = hetero_models.initial_parameters(spec, seed=0)
  users = np.arange(24, dtype=np.float32).reshape(3, 8)
  models = standalone.initial_personal_models(
      spec, params, tier=1, user_embeddings=users
  )
  np.testing.assert_array_equal(models['model']['user'], users[:, :4])
  for u in range(3):
    np.testing.assert_array_equal(
        models['model']['item_table'][u], params['item_tables'][1]
    )
    np.testing.assert_array_equal(
        models['model']['score_layers'][0]['kernel'][u],
        params['score_layers'][1][0]['kernel'],
    )
  assert models['adam_step'].shape == (3,)
