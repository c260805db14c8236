import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec import scoring
from tff_fedrec.algorithms.hetefedrec import models as hetero_models

_SPEC = hetero_models.HeteroSpec(num_items=6, widths=(2, 3, 5),
                                 hidden_units=(4, 3))


def test_tables_start_from_one_point_on_their_shared_prefix():
  # Eq. 10 needs V_s = V_m[:, :N_s] = V_l[:, :N_s] and
  # V_m = V_l[:, :N_m] at the start.
  tables = hetero_models.initial_parameters(_SPEC, seed=0)['item_tables']
  assert [t.shape for t in tables] == [(6, 2), (6, 3), (6, 5)]
  np.testing.assert_array_equal(tables[1][:, :2], tables[0])
  np.testing.assert_array_equal(tables[2][:, :3], tables[1])


def test_scorer_widths_follow_the_tier():
  layers = hetero_models.initial_parameters(_SPEC, seed=0)['score_layers']
  for tier, width in enumerate(_SPEC.widths):
    assert [l['kernel'].shape for l in layers[tier]] == [
        (2 * width, 4), (4, 3), (3, 1)
    ]


def test_score_all_items_equals_the_concatenated_model():
  params = hetero_models.initial_parameters(_SPEC, seed=1)
  rng = np.random.default_rng(0)
  users = rng.normal(size=(4, 3)).astype(np.float32)
  table = rng.normal(size=(6, 3)).astype(np.float32)
  layers = tf.nest.map_structure(tf.constant, params['score_layers'][1])
  got = hetero_models.score_all_items(users, table, layers)
  expected = scoring.neural_cf_logits(
      np.broadcast_to(table, (4, 6, 3)), users,
      [(layer['kernel'], layer['bias']) for layer in layers],
  )
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_score_all_items_with_one_model_per_user_scores_each_with_its_own():
  rng = np.random.default_rng(2)
  users = rng.normal(size=(2, 3)).astype(np.float32)
  tables = rng.normal(size=(2, 6, 3)).astype(np.float32)
  per_user = [
      hetero_models.initial_parameters(_SPEC, seed=s)['score_layers'][1]
      for s in (3, 4)
  ]
  stacked = tf.nest.map_structure(
      lambda a, b: tf.constant(np.stack([a, b])), *per_user
  )
  got = hetero_models.score_all_items(users, tables, stacked)
  for u in range(2):
    own = tf.nest.map_structure(tf.constant, per_user[u])
    np.testing.assert_allclose(
        got[u],
        hetero_models.score_all_items(users[u : u + 1], tables[u], own)[0],
        rtol=1e-5, atol=1e-6,
    )
  assert not np.allclose(got[0], got[1])


def test_user_embeddings_are_stored_at_the_largest_width():
  users = hetero_models.initial_user_embeddings(_SPEC, 7, seed=0)
  assert users.shape == (7, 5)


@pytest.mark.parametrize('widths', [(2, 2, 4), (4, 3, 8), (0, 1, 2), (1, 2)])
def test_bad_widths_are_refused(widths):
  with pytest.raises(ValueError, match='widths'):
    hetero_models.HeteroSpec(num_items=3, widths=widths)


def test_lightgcn_user_is_the_mean_of_its_two_layers():
  spec = hetero_models.HeteroSpec(num_items=6, widths=(2, 3, 5),
                                  model='lightgcn')
  user = np.array([[1.0, 2.0]], np.float32)
  # Neighbours v = [1, 0] and [3, 4]: layer 1 = ([4, 4]) / sqrt(2).
  got = hetero_models.user_representation(
      spec, user, np.array([[4.0, 4.0]], np.float32), np.array([2]))
  np.testing.assert_allclose(
      got, [[(1 + 4 / np.sqrt(2)) / 2, (2 + 4 / np.sqrt(2)) / 2]], rtol=1e-6)
  # No neighbours: layer 1 is 0. NCF leaves the user as it is.
  np.testing.assert_allclose(
      hetero_models.user_representation(
          spec, user, np.zeros([1, 2], np.float32), np.array([0])),
      user / 2)
  np.testing.assert_array_equal(
      hetero_models.user_representation(_SPEC, user, None, None), user)


def test_lightgcn_with_one_neighbour_adds_it_unscaled():
  # |N_u| = 1: 1 / sqrt(1) = 1, so u' = (u + v) / 2.
  spec = hetero_models.HeteroSpec(num_items=6, widths=(2, 3, 5),
                                  model='lightgcn')
  got = hetero_models.user_representation(
      spec, np.array([[1.0, 2.0]], np.float32),
      np.array([[3.0, -2.0]], np.float32), np.array([1]))
  np.testing.assert_allclose(got, [[2.0, 0.0]], rtol=1e-6)


@pytest.mark.parametrize('neighbor_gradient', [True, False])
def test_neighbor_gradient_decides_whether_items_learn_through_users(
    neighbor_gradient,
):
  spec = hetero_models.HeteroSpec(num_items=6, widths=(2, 3, 5),
                                  model='lightgcn',
                                  neighbor_gradient=neighbor_gradient)
  neighbor_sum = tf.Variable([[4.0, 4.0]])
  with tf.GradientTape() as tape:
    # d/d(neighbor_sum) of sum(u') = 1 / (2 sqrt(|N_u|)) per entry.
    total = tf.reduce_sum(hetero_models.user_representation(
        spec, tf.constant([[1.0, 2.0]]), neighbor_sum, tf.constant([4])))
  gradient = tape.gradient(total, neighbor_sum)
  if neighbor_gradient:
    np.testing.assert_allclose(gradient, [[0.25, 0.25]], rtol=1e-6)
  else:
    assert gradient is None or not np.any(gradient)


def test_the_defaults_are_the_papers_sizes():
  # HeteFedRec Sec. V.D (ML and Anime): tiers of width 8, 16 and 32,
  # feed-forward layers [2 N, 8, 8].
  spec = hetero_models.HeteroSpec(num_items=3)
  assert spec.widths == (8, 16, 32)
  assert spec.hidden_units == (8, 8)


def test_sizes_and_options_at_their_limits():
  hetero_models.HeteroSpec(num_items=1, widths=(1, 2, 3))
  with pytest.raises(ValueError, match='num_items'):
    hetero_models.HeteroSpec(num_items=0)
  with pytest.raises(ValueError, match='lightgcn model only'):
    hetero_models.HeteroSpec(num_items=3, model='ncf',
                             neighbor_gradient=False)
