"""Tests of P (APFR-GKD Eq. 4-5) and the adapter."""

import numpy as np
import pytest

from tff_fedrec.algorithms.apfr_gkd import heterogeneity


def test_mean_pairwise_distance_of_a_hand_example():
  # Pairs: (0,0)-(3,4) = 5, (0,0)-(0,8) = 8, (3,4)-(0,8) = 5; mean 6. The
  # sum of squares, or dividing by k^2, would give other values.
  centroids = np.array([[0.0, 0.0], [3.0, 4.0], [0.0, 8.0]])
  assert heterogeneity.mean_pairwise_centroid_distance(centroids) == (
      pytest.approx(6.0))


def test_mean_pairwise_distance_needs_two_centres():
  with pytest.raises(ValueError, match='2 centres'):
    heterogeneity.mean_pairwise_centroid_distance(np.zeros([1, 3]))


def _csr(item_lists):
  offsets = np.concatenate([[0], np.cumsum([len(i) for i in item_lists])])
  return offsets, np.concatenate(item_lists)


def _users(rng, num_users, num_items, item_pool_of_user, per_user=20):
  return [np.sort(rng.choice(item_pool_of_user(u), per_user, replace=False))
          for u in range(num_users)]


def test_planted_clusters_give_a_higher_p_than_one_population():
  rng = np.random.default_rng(0)
  num_users, num_items = 300, 200
  # Five groups of users, each drawing from its own 40 items.
  planted = _users(rng, num_users, num_items,
                   lambda u: np.arange(40) + 40 * (u % 5))
  # Everyone draws from the same 200 items.
  mixed = _users(rng, num_users, num_items, lambda u: np.arange(num_items))
  p_planted = heterogeneity.heterogeneity(*_csr(planted), num_items,
                                          num_clusters=5, dim=8)
  p_mixed = heterogeneity.heterogeneity(*_csr(mixed), num_items,
                                        num_clusters=5, dim=8)
  assert p_planted > 1.5 * p_mixed
  assert heterogeneity.personalization_mode(p_planted, threshold=(
      p_planted + p_mixed) / 2) == 'dual'
  assert heterogeneity.personalization_mode(p_mixed, threshold=(
      p_planted + p_mixed) / 2) == 'unary'


@pytest.mark.parametrize('num_users, num_items', [(60, 30), (20, 50)])
def test_preference_vectors_recover_the_svd_and_are_standardised(
    num_users, num_items):
  # Four groups of users preferring their own quarter of the items: the
  # spectrum has a gap after 4 values, so the factors are well defined.
  rng = np.random.default_rng(1)
  quarter = num_items // 4
  items = _users(
      rng, num_users, num_items,
      lambda u: np.concatenate([np.arange(quarter) + quarter * (u % 4),
                                rng.choice(num_items, 2, replace=False)]),
      per_user=6)
  offsets, flat = _csr(items)
  vectors = heterogeneity.preference_vectors(offsets, flat, num_items, dim=4)
  matrix = np.zeros([num_users, num_items])
  for user, user_items in enumerate(items):
    matrix[user, user_items] = 1
  u, s, _ = np.linalg.svd(matrix, full_matrices=False)
  exact = u[:, :4] * s[:4]
  exact = (exact - exact.mean(0)) / (exact.std(0) * 2)  # 1 / sqrt(m = 4)
  # Singular vectors are defined up to sign.
  signs = np.sign(np.sum(vectors * exact, axis=0))
  np.testing.assert_allclose(vectors * signs, exact, atol=1e-3)
  np.testing.assert_allclose(vectors.std(0), 0.5, atol=1e-4)


def test_a_sample_of_users_is_drawn_with_the_seed():
  rng = np.random.default_rng(2)
  items = _users(rng, 100, 50, lambda u: np.arange(50), per_user=10)
  offsets, flat = _csr(items)
  a = heterogeneity.heterogeneity(offsets, flat, 50, sample_users=40, seed=3)
  b = heterogeneity.heterogeneity(offsets, flat, 50, sample_users=40, seed=3)
  assert a == b
