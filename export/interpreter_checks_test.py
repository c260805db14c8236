"""Tests of the interpreter checks on models with known scores."""

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec import metrics
from tff_fedrec import models
from tff_fedrec.export import interpreter_checks
from tff_fedrec.export import on_device_model
from tff_fedrec.export import tflite_conversion

_NUM_ITEMS = 120


def _ramp_model(*, bake_user: bool, quantization: str = 'float32'):
  """FedMF with d = 1 and q_j = j: item j scores j p_u, so for p_u = 1 the
  rank of an item among others is fixed by its id."""
  module = on_device_model.OnDeviceRecommender(
      'matrix_factorization',
      np.arange(_NUM_ITEMS, dtype=np.float32)[:, None],
      user_embedding=np.ones(1, np.float32) if bake_user else None,
  )
  return module, tflite_conversion.convert_to_tflite(
      module,
      quantization,
      representative_item_ids=np.arange(_NUM_ITEMS),
      representative_user_embeddings=None if bake_user else [[1.0], [-1.0]],
  )


@pytest.fixture(scope='module')
def baked_ramp():
  return _ramp_model(bake_user=True)


@pytest.fixture(scope='module')
def user_input_ramp():
  return _ramp_model(bake_user=False)


def test_interpreter_scores_of_the_ramp(baked_ramp):
  _, model = baked_ramp

  scores = interpreter_checks.interpreter_scores(model, [7, 0, 119])

  np.testing.assert_array_equal(scores, [7.0, 0.0, 119.0])


def test_interpreter_scores_with_a_user_input(user_input_ramp):
  _, model = user_input_ramp

  scores = interpreter_checks.interpreter_scores(model, [7, 3], [-2.0])

  np.testing.assert_array_equal(scores, [-14.0, -6.0])


@pytest.mark.parametrize(
    'exclude,expected',
    [
        ([], list(range(119, 109, -1))),
        ([119, 117, 117, 100], [118, *range(116, 107, -1)]),
    ],
    ids=['nothing excluded', 'some excluded'],
)
def test_interpreter_top_k_skips_excluded_items(baked_ramp, exclude, expected):
  _, model = baked_ramp

  ids, scores = interpreter_checks.interpreter_top_k(model, exclude)

  np.testing.assert_array_equal(ids, expected)
  np.testing.assert_array_equal(scores, np.array(expected, np.float32))


def test_interpreter_top_k_returns_fewer_when_few_items_are_left(baked_ramp):
  _, model = baked_ramp

  ids, _ = interpreter_checks.interpreter_top_k(model, np.arange(3, 120))

  np.testing.assert_array_equal(ids, [2, 1, 0])


def test_interpreter_top_k_with_a_user_input(user_input_ramp):
  _, model = user_input_ramp

  # p_u = -1 reverses the ramp: the smallest ids are best.
  ids, _ = interpreter_checks.interpreter_top_k(model, [0, 2], [-1.0])

  np.testing.assert_array_equal(ids, [1, 3, 4, 5, 6, 7, 8, 9, 10, 11])


@pytest.mark.parametrize('bad_id', [-1, _NUM_ITEMS])
def test_the_interpreter_rejects_ids_out_of_range(baked_ramp, bad_id):
  _, model = baked_ramp

  with pytest.raises(RuntimeError, match='GATHER'):
    interpreter_checks.interpreter_scores(model, [3, bad_id])
  with pytest.raises(RuntimeError, match='SCATTER_ND'):
    interpreter_checks.interpreter_top_k(model, [bad_id])


def _random_float32_model(architecture, seed):
  """(spec, params, TFLite float32 model) of a random one-layer scorer."""
  spec = models.RecommenderSpec(architecture, _NUM_ITEMS, 8, (8,))
  params = models.initial_parameters(spec, seed)
  module = on_device_model.OnDeviceRecommender.from_model_parameters(
      architecture, params
  )
  return spec, params, tflite_conversion.convert_to_tflite(module)


def test_random_model_top_k_matches_numpy_argsort():
  spec, params, model = _random_float32_model('neural_cf', seed=0)
  logits = models.logits(spec, params, np.arange(_NUM_ITEMS)).numpy()
  exclude = np.random.default_rng(0).choice(_NUM_ITEMS, 40, replace=False)
  allowed = np.setdiff1d(np.arange(_NUM_ITEMS), exclude)

  ids, _ = interpreter_checks.interpreter_top_k(model, exclude)

  np.testing.assert_array_equal(
      ids, allowed[np.argsort(-logits[allowed])][:10]
  )


@pytest.mark.parametrize(
    'fixture,user,message',
    [
        ('baked_ramp', [1.0], 'has no user_embedding input'),
        ('user_input_ramp', None, r'takes user_embedding input; pass .*\[d\]'),
    ],
)
def test_user_embedding_must_match_the_model(request, fixture, user, message):
  _, model = request.getfixturevalue(fixture)

  with pytest.raises(ValueError, match=message):
    interpreter_checks.interpreter_scores(model, [1], user)
  with pytest.raises(ValueError, match=message):
    interpreter_checks.interpreter_top_k(model, [1], user)


def test_max_score_difference_is_zero_for_float32(baked_ramp, user_input_ramp):
  items = [5, 60, 119]

  assert interpreter_checks.max_score_difference(*baked_ramp[::-1], items) == 0
  assert (
      interpreter_checks.max_score_difference(
          *user_input_ramp[::-1], items, [0.5]
      )
      == 0
  )


def test_max_score_difference_sees_float16_rounding():
  # float16 has 11 significant bits: near 100 its spacing is 2^-4, so the
  # weight 100.1 is stored as 100.125.
  module = on_device_model.OnDeviceRecommender(
      'matrix_factorization',
      np.array([[100.1]], np.float32),
      user_embedding=np.ones(1, np.float32),
  )
  model = tflite_conversion.convert_to_tflite(module, 'float16')

  difference = interpreter_checks.max_score_difference(model, module, [0])

  assert difference == pytest.approx(100.125 - np.float32(100.1), rel=1e-4)


def test_ranking_metrics_of_known_ranks(baked_ramp):
  _, model = baked_ramp
  # Ranks from the ramp: test item 119 above all of 0..98 (rank 1); 100
  # below 101, 102 (rank 3); 100 below 101..111 (rank 12).
  test_items = [119, 100, 100]
  negatives = [
      list(range(99)),
      list(range(97)) + [101, 102],
      list(range(88)) + list(range(101, 112)),
  ]

  result = interpreter_checks.ranking_metrics_with_interpreter(
      model, test_items, negatives, k=10
  )

  # HR@10 = (1 + 1 + 0) / 3; NDCG@10 = (1/log2(2) + 1/log2(4) + 0) / 3.
  assert result == pytest.approx({'hr@10': 2 / 3, 'ndcg@10': 0.5})


def test_ranking_metrics_with_user_inputs(user_input_ramp):
  _, model = user_input_ramp
  negatives = [list(range(99))] * 2

  # p_u = 1 ranks item 100 first; p_u = -1 ranks it last of 100.
  result = interpreter_checks.ranking_metrics_with_interpreter(
      model, [100, 100], negatives, user_embeddings=[[1.0], [-1.0]], k=5
  )

  assert result == pytest.approx({'hr@5': 0.5, 'ndcg@5': 0.5})


def test_ranking_metrics_equal_the_metrics_of_tf_scores():
  spec, params, model = _random_float32_model('score_function', seed=1)
  rng = np.random.default_rng(1)
  candidates = np.stack(
      [rng.choice(_NUM_ITEMS, 100, replace=False) for _ in range(20)]
  )
  tf_scores = models.logits(spec, params, tf.constant(candidates)).numpy()

  result = interpreter_checks.ranking_metrics_with_interpreter(
      model, candidates[:, 0], candidates[:, 1:], k=10
  )

  expected = metrics.summarize_sampled(tf_scores, ks=(10,))
  assert result == pytest.approx(
      {'hr@10': expected['hr@10'], 'ndcg@10': expected['ndcg@10']}
  )


def test_ranking_metrics_reject_mismatched_shapes(baked_ramp):
  _, model = baked_ramp

  with pytest.raises(ValueError, match=r'\[U\].*\[U, M\]'):
    interpreter_checks.ranking_metrics_with_interpreter(
        model, [1, 2], [[3, 4]]
    )
  with pytest.raises(ValueError, match='1 user_embeddings for 2'):
    interpreter_checks.ranking_metrics_with_interpreter(
        model, [1, 2], [[3], [4]], user_embeddings=[[1.0]]
    )


def test_float_operators_of_float32_and_full_integer():
  module, float_model = _ramp_model(bake_user=False)
  integer_model = tflite_conversion.convert_to_tflite(
      module,
      'full_integer',
      representative_item_ids=np.arange(_NUM_ITEMS),
      representative_user_embeddings=[[1.0], [-1.0]],
  )

  # <p_u, q_j> for a user input is a float BATCH_MATMUL of gathered rows.
  assert {'GATHER', 'BATCH_MATMUL'} <= interpreter_checks.float_operators(
      float_model
  )
  assert interpreter_checks.float_operators(integer_model) == set()
