"""Tests that every architecture converts in every quantization and that the
TFLite interpreter scores like training does."""

import numpy as np
import pytest

from tff_fedrec import models
from tff_fedrec.export import interpreter_checks
from tff_fedrec.export import on_device_model
from tff_fedrec.export import tflite_conversion

_NUM_ITEMS = 120
_DIM = 16
_HIDDEN = (16, 8)

# (architecture, user vector baked in); 'score_function' has no user vector.
_FORMS = [
    ('score_function', True),
    ('matrix_factorization', True),
    ('matrix_factorization', False),
    ('neural_cf', True),
    ('neural_cf', False),
]

# Largest |TFLite score - training logit| allowed, as a fraction of the
# spread (max - min) of the training logits over all items. The observed
# fractions on such random models are below 1e-6 (float32), 1e-3 (float16),
# 1.2e-2 (dynamic_range, int8 weights) and 2.4e-2 (full_integer: int8
# activations too, 256 levels per tensor, errors adding up over layers).
_TOLERANCE = {
    'float32': 1e-5,
    'float16': 2e-3,
    'dynamic_range': 3e-2,
    'full_integer': 5e-2,
}


def _random_model(architecture, seed=0):
  spec = models.RecommenderSpec(
      architecture,
      _NUM_ITEMS,
      _DIM,
      _HIDDEN if architecture != 'matrix_factorization' else (),
  )
  return spec, models.initial_parameters(spec, seed)


def _convert(architecture, baked, params, quantization, users):
  """TFLite model of `params`, calibrated on all items and `users`."""
  module = on_device_model.OnDeviceRecommender.from_model_parameters(
      architecture, params, bake_user_embedding=baked
  )
  return tflite_conversion.convert_to_tflite(
      module,
      quantization,
      representative_item_ids=np.arange(len(params['item_embedding'])),
      representative_user_embeddings=users,
  )


@pytest.mark.parametrize('quantization', tflite_conversion.QUANTIZATIONS)
@pytest.mark.parametrize('architecture,baked', _FORMS)
def test_interpreter_scores_like_training(architecture, baked, quantization):
  spec, params = _random_model(architecture)
  user_input = None if baked else params['user_embedding']
  # Calibration sees this user and three others.
  users = None if baked else np.vstack([
      [user_input],
      np.random.default_rng(1).normal(scale=1 / _DIM, size=(3, _DIM)),
  ])
  model = _convert(architecture, baked, params, quantization, users)
  items = np.arange(_NUM_ITEMS)
  logits = models.logits(spec, params, items).numpy()

  scores = interpreter_checks.interpreter_scores(model, items, user_input)

  spread = logits.max() - logits.min()
  assert np.max(np.abs(scores - logits)) <= _TOLERANCE[quantization] * spread
  # The docstring's claim: full_integer does all its arithmetic in int8.
  assert (interpreter_checks.float_operators(model) == set()) == (
      quantization == 'full_integer'
  )


@pytest.mark.parametrize('architecture,baked', _FORMS)
def test_float32_top_k_is_the_training_top_k(architecture, baked):
  spec, params = _random_model(architecture, seed=2)
  model = _convert(architecture, baked, params, 'float32', None)
  logits = models.logits(spec, params, np.arange(_NUM_ITEMS)).numpy()
  exclude = np.argsort(-logits)[[0, 3, 4, 30]]
  allowed = np.setdiff1d(np.arange(_NUM_ITEMS), exclude)
  expected = allowed[np.argsort(-logits[allowed])][:10]

  ids, scores = interpreter_checks.interpreter_top_k(
      model, exclude, None if baked else params['user_embedding']
  )

  np.testing.assert_array_equal(ids, expected)
  np.testing.assert_allclose(scores, logits[expected], rtol=0, atol=1e-5)


def _well_separated_model(architecture, num_items=40):
  """Parameters whose logits are evenly spaced, (I - 1) gaps over the range.

  Item j's vector is t_j w with t_j a permutation of 1..I and w > 0; kernels,
  biases and the user vector are positive too, so every hidden unit is
  positive (ReLU is the identity) and the logit is affine and increasing in
  t_j. A gap is then range / (I - 1), several int8 steps of range / 255.
  """
  rng = np.random.default_rng(3)
  t = rng.permutation(num_items) + 1.0
  spec = models.RecommenderSpec(
      architecture,
      num_items,
      _DIM,
      _HIDDEN if architecture != 'matrix_factorization' else (),
  )
  params = {
      'item_embedding': (
          np.outer(t, rng.uniform(0.5, 1.0, _DIM)) / num_items
      ).astype(np.float32),
      'user_embedding': rng.uniform(0.5, 1.0, _DIM).astype(np.float32),
      'score_layers': [
          {
              'kernel': rng.uniform(0.1, 1.0, (fan_in, fan_out)).astype(
                  np.float32
              )
              / fan_in,
              'bias': rng.uniform(0.0, 0.1, fan_out).astype(np.float32),
          }
          for fan_in, fan_out in spec.score_layer_widths
      ],
  }
  if architecture == 'score_function':
    del params['user_embedding']
  return spec, params


@pytest.mark.parametrize('quantization', tflite_conversion.QUANTIZATIONS)
@pytest.mark.parametrize('architecture,baked', _FORMS)
def test_quantized_top_10_keeps_a_well_separated_order(
    architecture, baked, quantization
):
  spec, params = _well_separated_model(architecture)
  num_items = spec.num_items
  user_input = None if baked else params['user_embedding']
  model = _convert(
      architecture,
      baked,
      params,
      quantization,
      None if baked else user_input[None],
  )
  logits = models.logits(spec, params, np.arange(num_items)).numpy()
  order = np.argsort(-logits)
  exclude = order[[0, 5]]

  scores = interpreter_checks.interpreter_scores(
      model, np.arange(num_items), user_input
  )
  ids, _ = interpreter_checks.interpreter_top_k(model, exclude, user_input)

  np.testing.assert_array_equal(np.argsort(-scores)[:10], order[:10])
  np.testing.assert_array_equal(
      ids, [item for item in order if item not in exclude][:10]
  )


def test_full_integer_calibrated_on_the_users_items_scores_them():
  spec, params = _random_model('score_function', seed=5)
  user_items = np.array([4, 8, 15, 16, 23, 42])
  module = on_device_model.OnDeviceRecommender.from_model_parameters(
      'score_function', params
  )
  model = tflite_conversion.convert_to_tflite(
      module, 'full_integer', representative_item_ids=user_items
  )
  logits = models.logits(spec, params, user_items).numpy()

  scores = interpreter_checks.interpreter_scores(model, user_items)

  spread = logits.max() - logits.min()
  assert np.max(np.abs(scores - logits)) <= _TOLERANCE['full_integer'] * spread


def _small_module(architecture, baked):
  _, params = _random_model(architecture)
  return on_device_model.OnDeviceRecommender.from_model_parameters(
      architecture, params, bake_user_embedding=baked
  )


def test_unknown_quantization_names_the_allowed_ones():
  module = _small_module('score_function', True)

  with pytest.raises(ValueError, match="'int4'.*'float32', 'float16'"):
    tflite_conversion.convert_to_tflite(module, 'int4')


@pytest.mark.parametrize(
    'architecture,baked,kwargs,message',
    [
        ('score_function', True, {}, 'representative_item_ids'),
        (
            'score_function',
            True,
            {'representative_item_ids': []},
            'representative_item_ids',
        ),
        (
            'neural_cf',
            False,
            {'representative_item_ids': [1, 2]},
            'representative_user_embeddings',
        ),
        (
            'neural_cf',
            True,
            {
                'representative_item_ids': [1, 2],
                'representative_user_embeddings': np.zeros((1, _DIM)),
            },
            'takes no user_embedding',
        ),
    ],
)
def test_full_integer_needs_matching_calibration_inputs(
    architecture, baked, kwargs, message
):
  module = _small_module(architecture, baked)

  with pytest.raises(ValueError, match=message):
    tflite_conversion.convert_to_tflite(module, 'full_integer', **kwargs)


def test_quantizations_store_smaller_weights():
  # The item table, 120 x 16 weights, dominates: 4 bytes a weight in
  # float32, 2 in float16, 1 in dynamic_range and full_integer (plus a
  # float32 scale and an int64 zero point per row for dynamic_range's
  # per-channel quantization).
  _, params = _random_model('neural_cf', seed=6)
  sizes = {
      quantization: len(_convert('neural_cf', True, params, quantization, None))
      for quantization in tflite_conversion.QUANTIZATIONS
  }

  table_bytes = params['item_embedding'].nbytes
  assert sizes['float32'] - sizes['float16'] >= table_bytes / 2 * 0.9
  assert sizes['float32'] - sizes['dynamic_range'] >= table_bytes / 2
  assert sizes['float32'] - sizes['full_integer'] >= table_bytes * 3 / 4 * 0.9
