"""Tests of the on-device module against the training side's logits."""

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec import models
from tff_fedrec.algorithms.hetefedrec import models as hetero_models
from tff_fedrec.export import on_device_model

_NUM_ITEMS = 60
_DIM = 8
_HIDDEN = (16, 8)

# (architecture, user vector baked in); 'score_function' has no user vector.
_FORMS = [
    ('score_function', True),
    ('matrix_factorization', True),
    ('matrix_factorization', False),
    ('neural_cf', True),
    ('neural_cf', False),
]


def _spec_and_params(architecture, seed=0, num_items=_NUM_ITEMS):
  spec = models.RecommenderSpec(
      architecture,
      num_items,
      _DIM,
      _HIDDEN if architecture != 'matrix_factorization' else (),
  )
  return spec, models.initial_parameters(spec, seed)


def _module(architecture, baked, seed=0, num_items=_NUM_ITEMS, top_k=10):
  spec, params = _spec_and_params(architecture, seed, num_items)
  module = on_device_model.OnDeviceRecommender.from_model_parameters(
      architecture, params, bake_user_embedding=baked, top_k=top_k
  )
  user = () if baked else (tf.constant(params['user_embedding']),)
  return spec, params, module, user


@pytest.mark.parametrize('architecture,baked', _FORMS)
def test_score_is_the_training_logits(architecture, baked):
  spec, params, module, user = _module(architecture, baked)
  items = np.array([3, 0, 59, 3, 17], np.int32)

  scores = module.score(tf.constant(items), *user)['scores']

  np.testing.assert_allclose(
      scores, models.logits(spec, params, items), rtol=0, atol=1e-6
  )
  assert module.takes_user_embedding == (not baked)


@pytest.mark.parametrize('architecture,baked', _FORMS)
@pytest.mark.parametrize(
    'exclude',
    [[], [5, 17, 17, 40], list(range(0, _NUM_ITEMS, 2))],
    ids=['none', 'some with a repeat', 'half'],
)
def test_top_k_is_the_best_items_not_excluded(architecture, baked, exclude):
  spec, params, module, user = _module(architecture, baked, seed=1)
  logits = models.logits(spec, params, np.arange(_NUM_ITEMS)).numpy()
  allowed = np.setdiff1d(np.arange(_NUM_ITEMS), exclude)
  expected = allowed[np.argsort(-logits[allowed], kind='stable')][:10]

  outputs = module.top_k(tf.constant(exclude, tf.int32), *user)

  np.testing.assert_array_equal(outputs['item_ids'], expected)
  np.testing.assert_allclose(
      outputs['scores'], logits[expected], rtol=0, atol=1e-6
  )


def test_top_k_is_shorter_when_fewer_than_k_items_are_left():
  spec, params, module, _ = _module('score_function', True, num_items=12)
  exclude = [0, 2, 4, 6, 8]
  logits = models.logits(spec, params, np.arange(12)).numpy()
  allowed = np.array([1, 3, 5, 7, 9, 10, 11])

  outputs = module.top_k(tf.constant(exclude, tf.int32))

  np.testing.assert_array_equal(
      outputs['item_ids'], allowed[np.argsort(-logits[allowed])]
  )


def test_k_is_the_number_of_items_when_there_are_fewer_than_top_k():
  _, _, module, _ = _module('score_function', True, num_items=6, top_k=10)

  outputs = module.top_k(tf.constant([], tf.int32))

  assert module.k == 6
  assert sorted(outputs['item_ids'].numpy()) == list(range(6))


def test_top_k_orders_ties_by_lower_id():
  # Items 1 and 3 tie on <p, q> = 1, above item 0 (0.5) and 2 (0).
  module = on_device_model.OnDeviceRecommender(
      'matrix_factorization',
      np.array([[0.5], [1.0], [0.0], [1.0]], np.float32),
      user_embedding=np.ones(1, np.float32),
      top_k=3,
  )

  outputs = module.top_k(tf.constant([], tf.int32))

  np.testing.assert_array_equal(outputs['item_ids'], [1, 3, 0])


@pytest.mark.parametrize('base_model', hetero_models.MODELS)
def test_tier_global_model_scores_like_hetero_score_all_items(base_model):
  # A HeteFedRec medium tier's public {V_m, Theta_m} with the user vector as
  # input; for Fed-LightGCN the caller feeds the propagated user vector.
  spec = hetero_models.HeteroSpec(
      num_items=_NUM_ITEMS, widths=(4, 8, 16), model=base_model
  )
  public = hetero_models.initial_parameters(spec, seed=2)
  table, layers = public['item_tables'][1], public['score_layers'][1]
  user = hetero_models.initial_user_embeddings(spec, 1, seed=2)[:, :8]
  positives = table[[1, 4, 9]]
  user = np.asarray(
      hetero_models.user_representation(
          spec, user, positives.sum(axis=0)[None], np.array([3])
      )
  )
  kernels = [(l['kernel'], l['bias']) for l in layers]
  module = on_device_model.OnDeviceRecommender('neural_cf', table, kernels)
  split = on_device_model.OnDeviceRecommender(
      'neural_cf', table, kernels, split_first_layer=True)

  trained = hetero_models.score_all_items(user, table, layers)[0]
  scores = module.score(tf.range(_NUM_ITEMS), tf.constant(user[0]))['scores']
  split_scores = split.score(tf.range(_NUM_ITEMS),
                             tf.constant(user[0]))['scores']

  # The same function either way; with the first layer split, the function
  # the tier trained with (`scoring.neural_cf_logits`), to float rounding.
  np.testing.assert_allclose(scores, trained, rtol=0, atol=1e-6)
  np.testing.assert_allclose(split_scores, trained, rtol=0, atol=1e-7)


def test_signatures_are_named_score_and_top_k():
  _, _, module, _ = _module('neural_cf', False)

  signatures = module.signatures

  assert list(signatures) == ['score', 'top_k']
  inputs, _ = signatures['score'].structured_input_signature
  assert [spec.name for spec in inputs] == ['item_ids', 'user_embedding']
  assert set(signatures['top_k'].structured_outputs) == {'item_ids', 'scores'}


_TABLE = np.zeros((5, 4), np.float32)
_SCORER = [(np.zeros((4, 1), np.float32), np.zeros(1, np.float32))]
_NCF_LAYERS = [
    (np.zeros((8, 3), np.float32), np.zeros(3, np.float32)),
    (np.zeros((3, 1), np.float32), np.zeros(1, np.float32)),
]


@pytest.mark.parametrize(
    'args,kwargs,message',
    [
        (('two_tower', _TABLE, _SCORER), {}, 'Unknown architecture'),
        (('score_function', _TABLE, ()), {}, 'needs'),
        (('matrix_factorization', _TABLE, _SCORER), {}, 'needs'),
        (('neural_cf', _TABLE, _SCORER), {}, 'needs'),
        (('neural_cf', _TABLE, _NCF_LAYERS[:1]), {}, 'needs'),
        (('neural_cf', _TABLE[0], _NCF_LAYERS), {}, 'dimensions'),
        (
            ('score_function', _TABLE, _SCORER, np.zeros(4, np.float32)),
            {},
            'no user embedding',
        ),
        (
            ('neural_cf', _TABLE, _NCF_LAYERS, np.zeros(3, np.float32)),
            {},
            r'\[4\]',
        ),
        (('score_function', _TABLE, _SCORER), {'top_k': 0}, 'positive'),
    ],
)
def test_rejects_inconsistent_parameters(args, kwargs, message):
  with pytest.raises(ValueError, match=message):
    on_device_model.OnDeviceRecommender(*args, **kwargs)


def test_accepts_a_consistent_neural_cf():
  module = on_device_model.OnDeviceRecommender('neural_cf', _TABLE, _NCF_LAYERS)

  assert module.takes_user_embedding
