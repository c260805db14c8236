"""Tests of the recommender models and their global / local declaration."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec import models

_NUM_ITEMS = 7
_DIM = 4
_HIDDEN = (5, 3)

# (architecture, personal_score_layers) -> (global keys, local keys), from the
# rule in the module docstring: item embedding always global, user embedding
# always local, score layers local iff personal_score_layers; MF has none.
_DECLARATIONS = {
    ('score_function', True): (('item_embedding',), ('score_layers',)),
    ('score_function', False): (('item_embedding', 'score_layers'), ()),
    ('matrix_factorization', True): (('item_embedding',), ('user_embedding',)),
    ('matrix_factorization', False): (('item_embedding',), ('user_embedding',)),
    ('neural_cf', True): (
        ('item_embedding',), ('user_embedding', 'score_layers')
    ),
    ('neural_cf', False): (
        ('item_embedding', 'score_layers'), ('user_embedding',)
    ),
}

_SPEC_CASES = list(_DECLARATIONS)


def _spec(architecture, personal=True):
  return models.RecommenderSpec(
      architecture,
      _NUM_ITEMS,
      _DIM,
      _HIDDEN if architecture != 'matrix_factorization' else (),
      personal_score_layers=personal,
  )


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _numpy_logits(spec, params, items):
  """Eq. (6) before the sigmoid, for one user, in numpy."""
  q = np.asarray(params['item_embedding'])[items]
  if spec.architecture == 'matrix_factorization':
    return q @ np.asarray(params['user_embedding'])
  if spec.architecture == 'neural_cf':
    p = np.asarray(params['user_embedding'])
    hidden = np.concatenate([np.tile(p, (len(items), 1)), q], axis=1)
  else:
    hidden = q
  layers = params['score_layers']
  for index, layer in enumerate(layers):
    hidden = hidden @ np.asarray(layer['kernel']) + np.asarray(layer['bias'])
    if index < len(layers) - 1:
      hidden = np.maximum(hidden, 0.0)
  return hidden[:, 0]


@pytest.mark.parametrize('architecture,personal', _SPEC_CASES)
def test_global_and_local_declaration(architecture, personal):
  spec = _spec(architecture, personal)
  expected_global, expected_local = _DECLARATIONS[(architecture, personal)]

  assert spec.global_keys == expected_global
  assert spec.local_keys == expected_local
  assert 'item_embedding' in spec.global_keys
  if spec.has_user_embedding:
    assert 'user_embedding' in spec.local_keys
  assert sorted(spec.global_keys + spec.local_keys) == sorted(spec.keys)


def test_spec_rejects_unknown_architecture_and_empty_sizes():
  with pytest.raises(ValueError, match='Unknown architecture'):
    models.RecommenderSpec('transformer', _NUM_ITEMS, _DIM)
  with pytest.raises(ValueError):
    models.RecommenderSpec('score_function', 0, _DIM)
  with pytest.raises(ValueError):
    models.RecommenderSpec('score_function', _NUM_ITEMS, 0)
  # One item and width 1 are the smallest valid sizes.
  models.RecommenderSpec('score_function', 1, 1)


def test_the_default_spec_keeps_the_score_layers_on_the_client():
  # PFedRec's dual personalization (Sec. 4.2) unless said otherwise.
  spec = models.RecommenderSpec('score_function', _NUM_ITEMS, _DIM)
  assert 'score_layers' in spec.local_keys
  assert 'score_layers' not in spec.global_keys


@pytest.mark.parametrize(
    'architecture', ['score_function', 'matrix_factorization', 'neural_cf']
)
def test_initial_parameters_shapes(architecture):
  spec = _spec(architecture)
  params = models.initial_parameters(spec, seed=0)

  assert tuple(params) == spec.keys
  assert params['item_embedding'].shape == (_NUM_ITEMS, _DIM)
  if architecture == 'matrix_factorization':
    assert params['user_embedding'].shape == (_DIM,)
    assert 'score_layers' not in params
    return
  # The MLP input is q_j (d) for the score function and [p_u; q_j] (2d) for
  # NCF; hidden layers (5, 3) then the output layer of width 1.
  fan_in = _DIM if architecture == 'score_function' else 2 * _DIM
  expected = [(fan_in, 5), (5, 3), (3, 1)]
  assert [layer['kernel'].shape for layer in params['score_layers']] == expected
  assert [layer['bias'].shape for layer in params['score_layers']] == [
      (fan_out,) for _, fan_out in expected
  ]
  if architecture == 'neural_cf':
    assert params['user_embedding'].shape == (_DIM,)
  else:
    assert 'user_embedding' not in params
  for leaf in tf.nest.flatten(params):
    assert leaf.dtype == np.float32


@pytest.mark.parametrize(
    'architecture', ['score_function', 'matrix_factorization', 'neural_cf']
)
def test_initial_parameters_deterministic_under_seed(architecture):
  spec = _spec(architecture)
  first = tf.nest.flatten(models.initial_parameters(spec, seed=3))
  again = tf.nest.flatten(models.initial_parameters(spec, seed=3))
  other = tf.nest.flatten(models.initial_parameters(spec, seed=4))

  for a, b, c in zip(first, again, other):
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_item_embedding_rows_are_standard_normal():
  spec = models.RecommenderSpec('score_function', 20000, 8)
  item_embedding = models.initial_parameters(spec, seed=0)['item_embedding']

  # 160000 N(0, 1) samples: the sample mean has std 1/400 = 0.0025 and the
  # sample std about 1/sqrt(2 * 160000) = 0.0018; 0.02 is > 8 sigma.
  assert abs(item_embedding.mean()) < 0.02
  assert abs(item_embedding.std() - 1.0) < 0.02
  # Each column is N(0, 1) too, not just the pooled sample.
  np.testing.assert_allclose(item_embedding.std(axis=0), 1.0, atol=0.03)


def test_user_embedding_is_normal_with_std_one_over_d():
  d = 16
  spec = models.RecommenderSpec('matrix_factorization', 3, d)
  # 500 seeds x 16 = 8000 samples: the sample std is within 3% of 1/d at
  # > 8 sigma; 2/d or d would be far off.
  samples = np.concatenate([
      models.initial_parameters(spec, seed=seed)['user_embedding']
      for seed in range(500)
  ])
  assert abs(samples.std() * d - 1.0) < 0.07
  assert abs(samples.mean() * d) < 0.05


@pytest.mark.parametrize('architecture', ['score_function', 'neural_cf'])
def test_dense_layers_uniform_within_one_over_sqrt_fan_in(architecture):
  spec = models.RecommenderSpec(architecture, 3, 64, hidden_units=(256, 128))
  layers = models.initial_parameters(spec, seed=0)['score_layers']

  for (fan_in, fan_out), layer in zip(spec.score_layer_widths, layers):
    bound = 1.0 / np.sqrt(fan_in)
    for name in ('kernel', 'bias'):
      values = layer[name]
      assert np.all(np.abs(values) <= bound), (name, fan_in)
    kernel = layer['kernel']
    # U(-b, b) has std b / sqrt(3); with >= 128 samples the extremes come
    # within 5% of the bound and the std within 15% of b / sqrt(3).
    assert np.abs(kernel).max() > 0.95 * bound
    np.testing.assert_allclose(kernel.std(), bound / np.sqrt(3), rtol=0.15)
    assert kernel.shape == (fan_in, fan_out)


@pytest.mark.parametrize('architecture,personal', _SPEC_CASES)
def test_split_merge_round_trip(architecture, personal):
  spec = _spec(architecture, personal)
  params = models.initial_parameters(spec, seed=1)

  global_params, local_params = models.split_parameters(spec, params)
  merged = models.merge_parameters(spec, global_params, local_params)

  assert tuple(global_params) == spec.global_keys
  assert tuple(local_params) == spec.local_keys
  assert isinstance(merged, collections.OrderedDict)
  assert tuple(merged) == spec.keys
  tf.nest.map_structure(np.testing.assert_array_equal, merged, params)


def test_merge_takes_each_part_from_its_own_side():
  spec = _spec('neural_cf', personal=False)
  params = models.initial_parameters(spec, seed=1)
  global_params, local_params = models.split_parameters(spec, params)
  new_user = np.full([_DIM], 9.0, np.float32)

  merged = models.merge_parameters(
      spec, global_params, collections.OrderedDict(user_embedding=new_user)
  )

  np.testing.assert_array_equal(merged['user_embedding'], new_user)
  np.testing.assert_array_equal(
      merged['item_embedding'], params['item_embedding']
  )


@pytest.mark.parametrize(
    'architecture', ['score_function', 'matrix_factorization', 'neural_cf']
)
def test_logits_match_numpy(architecture):
  spec = _spec(architecture)
  params = models.initial_parameters(spec, seed=2)
  items = np.array([6, 0, 3, 3], np.int32)

  got = models.logits(spec, params, tf.constant(items))

  np.testing.assert_allclose(
      got, _numpy_logits(spec, params, items), rtol=1e-5, atol=1e-6
  )


@pytest.mark.parametrize('architecture,personal', _SPEC_CASES)
def test_model_variables_match_declaration(architecture, personal):
  spec = _spec(architecture, personal)
  params = models.initial_parameters(spec, seed=5)
  model = models.RecommenderModel(spec, params)

  expected_global = tf.nest.flatten([params[k] for k in spec.global_keys])
  expected_local = tf.nest.flatten([params[k] for k in spec.local_keys])

  assert len(model.global_variables) == len(expected_global)
  assert len(model.local_variables) == len(expected_local)
  for variable, value in zip(model.global_variables, expected_global):
    assert isinstance(variable, tf.Variable)
    np.testing.assert_array_equal(variable.numpy(), value)
  for variable, value in zip(model.local_variables, expected_local):
    assert isinstance(variable, tf.Variable)
    np.testing.assert_array_equal(variable.numpy(), value)
  # Together they are exactly the model's trainable variables, no overlap.
  global_refs = {v.ref() for v in model.global_variables}
  local_refs = {v.ref() for v in model.local_variables}
  assert not global_refs & local_refs
  all_refs = {v.ref() for v in model.trainable_variables}
  assert global_refs | local_refs == all_refs


@pytest.mark.parametrize(
    'architecture', ['score_function', 'matrix_factorization', 'neural_cf']
)
def test_model_call_equals_logits(architecture):
  spec = _spec(architecture)
  params = models.initial_parameters(spec, seed=6)
  model = models.RecommenderModel(spec, params)
  items = np.array([1, 4, 4, 0], np.int32)

  got = model({'item_ids': tf.constant(items)})

  np.testing.assert_allclose(
      got, models.logits(spec, params, tf.constant(items)), rtol=1e-6
  )
  np.testing.assert_allclose(model.score(tf.constant(items)), got,
                             rtol=1e-6)
  np.testing.assert_allclose(
      got, _numpy_logits(spec, params, items), rtol=1e-5, atol=1e-6
  )


def test_model_call_reads_its_variables():
  spec = _spec('matrix_factorization')
  params = models.initial_parameters(spec, seed=7)
  model = models.RecommenderModel(spec, params)
  new_items = np.arange(_NUM_ITEMS * _DIM, dtype=np.float32).reshape(
      _NUM_ITEMS, _DIM
  )
  model.parameters['item_embedding'].assign(new_items)

  got = model({'item_ids': tf.constant([2])})

  # <p_u, q_2> with the assigned q_2 = [8, 9, 10, 11].
  expected = new_items[2] @ params['user_embedding']
  np.testing.assert_allclose(got, [expected], rtol=1e-5)


@pytest.mark.parametrize(
    'architecture', ['score_function', 'matrix_factorization', 'neural_cf']
)
def test_compute_loss_is_mean_binary_cross_entropy(architecture):
  spec = _spec(architecture)
  params = models.initial_parameters(spec, seed=8)
  model = models.RecommenderModel(spec, params)
  items = np.array([0, 2, 5, 6, 2], np.int32)
  labels = np.array([1.0, 0.0, 1.0, 0.0, 0.0], np.float32)

  loss = model.compute_loss(
      {'item_ids': tf.constant(items), 'labels': tf.constant(labels)}
  )

  # Eq. (7) averaged over the batch:
  # -1/n sum_j [r_j log sigmoid(z_j) + (1 - r_j) log(1 - sigmoid(z_j))].
  probs = _sigmoid(_numpy_logits(spec, params, items).astype(np.float64))
  expected = -np.mean(labels * np.log(probs) + (1 - labels) * np.log(1 - probs))
  np.testing.assert_allclose(loss, expected, rtol=1e-4)


@pytest.mark.parametrize('architecture', ['matrix_factorization', 'neural_cf'])
def test_the_user_vector_as_an_input_and_from_a_table(architecture):
  spec = _spec(architecture)
  params = models.initial_parameters(spec, seed=9)
  users = np.random.default_rng(9).normal(size=[3, _DIM]).astype(np.float32)
  items = np.array([1, 4, 0], np.int32)
  shared = collections.OrderedDict(
      (k, v) for k, v in params.items() if k != 'user_embedding')
  tier_model = models.RecommenderModel(spec, shared, user_embedding='input')
  table_model = models.RecommenderModel(
      spec, collections.OrderedDict(shared, user_embedding=users),
      user_embedding='table')

  got_input = tier_model({'item_ids': tf.constant(items),
                          'user_embedding': tf.constant(users)})
  got_table = table_model({'item_ids': tf.constant(items),
                           'user_ids': tf.constant([0, 1, 2])})

  # Example b is user b's logit of item b, by its own model.
  want = [_numpy_logits(spec, collections.OrderedDict(
      params, user_embedding=users[b]), items[b:b + 1])[0] for b in range(3)]
  np.testing.assert_allclose(got_input, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got_table, want, rtol=1e-5, atol=1e-6)
  assert tier_model.takes_user_embedding
  assert not table_model.takes_user_embedding
  # The table is the client-local part, the rest global.
  assert len(table_model.local_variables) == (
      1 + (len(tf.nest.flatten(params['score_layers']))
           if 'score_layers' in spec.local_keys else 0))
  with pytest.raises(ValueError, match='no user embedding'):
    models.RecommenderModel(_spec('score_function'), shared,
                            user_embedding='input')


@pytest.mark.parametrize('architecture', ['score_function', 'neural_cf'])
def test_top_k_is_the_best_items_never_an_excluded_one(architecture):
  spec = _spec(architecture)
  params = models.initial_parameters(spec, seed=10)
  model = models.RecommenderModel(spec, params)
  scores = _numpy_logits(spec, params, np.arange(_NUM_ITEMS))
  exclude = np.array([int(np.argmax(scores)), 2, 2], np.int32)

  ids, got = model.top_k(tf.constant(exclude), k=3)

  order = [i for i in np.argsort(-scores, kind='stable')
           if i not in exclude][:3]
  np.testing.assert_array_equal(ids, order)
  np.testing.assert_allclose(got, scores[order], rtol=1e-5, atol=1e-6)
