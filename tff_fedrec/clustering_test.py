"""Tests of k-means (greedy k-means++ and Lloyd) against numpy and
scikit-learn."""

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec import clustering

_SEED = tf.constant([7, 11], tf.int64)


def _clustered_rows(seed, sizes, width=3, spread=0.01, distance=10.0):
  """Rows around well-separated centres, shuffled, and their true labels.

  Centres are `distance` apart along the axes (centre j = distance * e_j,
  wrapped past `width`, scaled up by the wrap count) and every row lies
  within `spread` of its centre, so any k-means optimum with k = len(sizes)
  is the true partition.
  """
  rng = np.random.default_rng(seed)
  centres = np.zeros([len(sizes), width])
  for j in range(len(sizes)):
    centres[j, j % width] = distance * (1 + j // width)
  labels = np.repeat(np.arange(len(sizes)), sizes)
  rows = centres[labels] + rng.uniform(-spread, spread, [len(labels), width])
  order = rng.permutation(len(labels))
  return rows[order].astype(np.float32), labels[order]


def _assert_same_partition(got_labels, true_labels):
  """The two labelings group the rows identically (up to renaming)."""
  pairs = set(zip(got_labels.tolist(), true_labels.tolist()))
  assert len(pairs) == len(set(got_labels.tolist()))
  assert len(pairs) == len(set(true_labels.tolist()))


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_kmeans_recovers_separated_clusters_and_their_means(seed):
  # Unequal sizes, including a single-row cluster: D^2 sampling still
  # gives it a centre, as a uniform draw would rarely do.
  rows, labels = _clustered_rows(seed, sizes=[12, 1, 5, 7, 3])

  result = clustering.kmeans(
      rows, 5, tf.constant([seed, 3], tf.int64)
  )

  assignments = result.assignments.numpy()
  _assert_same_partition(assignments, labels)
  # Each centroid is the mean of its rows: Lloyd moved the k-means++
  # centres (which are rows themselves) to the means.
  for cluster in range(5):
    np.testing.assert_allclose(
        result.centroids[cluster],
        rows[assignments == cluster].mean(axis=0),
        rtol=1e-6,
    )


def _numpy_sample(weights, uniform):
  """Inverse-CDF draw: the first i whose cumulative weight exceeds u * total."""
  cumulative = np.cumsum(weights.astype(np.float32))
  index = np.searchsorted(cumulative, uniform * cumulative[-1], side='right')
  return min(int(index), len(weights) - 1)


def _numpy_kmeans_plus_plus(rows, k, uniforms, trials, follow=None):
  """scikit-learn's greedy k-means++ (`_kmeans_plusplus`), written from its
  description, drawing from the given uniforms [k, >= trials]. Candidates
  whose potentials tie (to 1e-6, float32's reach) are all right: with
  `follow` (centres [k, d]) the reference takes the tied one that `follow`
  took, and fails if `follow` took none of them."""
  rows = rows.astype(np.float64)
  weights = np.ones(len(rows))
  centres = [rows[_numpy_sample(weights, uniforms[0, 0])]]
  nearest = ((rows - centres[0]) ** 2).sum(axis=1)
  for j in range(1, k):
    candidates = [_numpy_sample(weights * nearest, u)
                  for u in uniforms[j, :trials]]
    distances = ((rows[None] - rows[candidates][:, None]) ** 2).sum(axis=2)
    potentials = np.minimum(nearest, distances).sum(axis=1)
    best = int(np.argmin(potentials))
    tied = np.flatnonzero(potentials <= potentials[best] * (1 + 1e-6))
    if follow is not None:
      taken = [t for t in tied
               if np.allclose(rows[candidates[t]], follow[j], rtol=1e-6)]
      best = int(taken[0]) if taken else best
    centres.append(rows[candidates[best]])
    nearest = np.minimum(nearest, distances[best])
  return np.stack(centres)


def _numpy_lloyd(rows, centres, steps):
  """`steps` Lloyd steps; an emptied cluster keeps its centre. Returns
  (centres, assignments)."""
  rows = rows.astype(np.float64)
  for _ in range(steps + 1):
    assignments = ((rows[:, None] - centres[None]) ** 2).sum(2).argmin(1)
    if _ == steps:
      break
    centres = np.stack([
        rows[assignments == j].mean(0) if np.any(assignments == j)
        else centres[j]
        for j in range(len(centres))
    ])
  return centres, assignments


def _inertia(rows, centres, assignments):
  return float(((rows.astype(np.float64) - centres[assignments]) ** 2).sum())


def _heavy_tailed_rows(seed, n=240, d=6):
  """Rows like item gradients: a few large, most small (Student t, 2 dof)."""
  return np.random.default_rng(seed).standard_t(2, size=(n, d)).astype(
      np.float32)


@pytest.mark.parametrize('seed', [0, 1, 2, 3])
@pytest.mark.parametrize('scale', [1.0, 1e-4])
def test_the_initial_centres_are_greedy_k_means_plus_plus(seed, scale):
  # With no Lloyd step the centroids are the initial centres: the best of
  # 2 + floor(ln k) D^2-sampled candidates each, as scikit-learn picks
  # them. A single candidate per centre (plain k-means++) or the farthest
  # row would give other centres. Scaled by 1e-4, as small as aggregated
  # gradients, the squared distances sum to well below 1: D^2 sampling
  # must not depend on their scale.
  rows, k = _heavy_tailed_rows(seed) * np.float32(scale), 12
  if scale < 1:
    assert np.sum(np.square(rows - rows[0])) < 1e-2
  tf_seed = tf.constant([seed, 5], tf.int64)
  trials = 2 + int(np.floor(np.log(k)))
  assert int(clustering.local_trials(k)) == trials == 4
  uniforms = tf.random.stateless_uniform([k, trials], tf_seed).numpy()

  got = clustering.kmeans(rows, k, tf_seed, num_iterations=0)

  expected = _numpy_kmeans_plus_plus(rows, k, uniforms, trials,
                                     follow=got.centroids.numpy())
  np.testing.assert_allclose(got.centroids, expected, rtol=1e-6)
  single = _numpy_kmeans_plus_plus(rows, k, uniforms, 1)
  assert not np.allclose(single, expected)


@pytest.mark.parametrize('seed', [0, 1])
@pytest.mark.parametrize('steps', [1, 2, 20])
def test_lloyd_steps_match_numpy_from_the_same_start(seed, steps):
  # 40 heavy-tailed rows into 12 clusters: outliers end as singletons,
  # whose centre moves onto their row like any other; 1 and 2 steps are
  # far from converged, so the step count shows.
  rows, k = _heavy_tailed_rows(seed, n=40, d=4), 12
  tf_seed = tf.constant([seed, 9], tf.int64)
  start = clustering.kmeans(rows, k, tf_seed, num_iterations=0)

  got = clustering.kmeans(rows, k, tf_seed, num_iterations=steps)

  centres, assignments = _numpy_lloyd(rows, start.centroids.numpy(), steps)
  np.testing.assert_array_equal(got.assignments, assignments)
  np.testing.assert_allclose(got.centroids, centres, rtol=1e-4, atol=1e-5)
  if steps == 1:
    assert np.any(np.bincount(assignments, minlength=k) == 1)
    one_step_less = _numpy_lloyd(rows, start.centroids.numpy(), 0)[0]
    assert not np.allclose(centres, one_step_less)


def test_the_objective_on_heavy_tailed_rows_is_scikit_learn_s():
  # The paper ran scikit-learn's KMeans (App. A.2). Over 8 draws of
  # heavy-tailed rows our 20-step k-means reaches its objective (n_init 1,
  # greedy k-means++) to within 3% on average; plain k-means++ (one
  # candidate per centre, then the same Lloyd steps) is further off.
  from sklearn import cluster  # A test-only reference.
  ours, theirs, plain = [], [], []
  for seed in range(8):
    rows, k = _heavy_tailed_rows(100 + seed), 16
    tf_seed = tf.constant([seed, 1], tf.int64)
    result = clustering.kmeans(rows, k, tf_seed)
    ours.append(_inertia(rows, result.centroids.numpy().astype(np.float64),
                         result.assignments.numpy()))
    theirs.append(cluster.KMeans(k, n_init=1, random_state=seed).fit(
        rows.astype(np.float64)).inertia_)
    uniforms = tf.random.stateless_uniform([k, 1], tf_seed).numpy()
    centres, assignments = _numpy_lloyd(
        rows, _numpy_kmeans_plus_plus(rows, k, uniforms, 1), 20)
    plain.append(_inertia(rows, centres, assignments))
  assert np.mean(ours) <= 1.03 * np.mean(theirs)
  assert np.mean(plain) > np.mean(ours)


def test_kmeans_is_a_function_of_the_seed():
  rng = np.random.default_rng(5)
  rows = rng.normal(size=[40, 4]).astype(np.float32)

  first = clustering.kmeans(rows, 6, _SEED)
  again = clustering.kmeans(rows, 6, _SEED)

  np.testing.assert_array_equal(first.centroids, again.centroids)
  np.testing.assert_array_equal(first.assignments, again.assignments)


def test_kmeans_ignores_padding_rows():
  rows, labels = _clustered_rows(3, sizes=[6, 4, 5])
  # Padding far from every real row would take a centre of its own, or
  # drag a mean, if the mask let it in.
  padded = np.concatenate([rows, np.full([4, 3], 1e4, np.float32)])
  mask = np.array([True] * len(rows) + [False] * 4)

  result = clustering.kmeans(padded, 3, _SEED, row_mask=mask)

  assignments = result.assignments.numpy()
  np.testing.assert_array_equal(assignments[~mask], -1)
  _assert_same_partition(assignments[mask], labels)
  for cluster in range(3):
    np.testing.assert_allclose(
        result.centroids[cluster],
        rows[assignments[mask] == cluster].mean(axis=0),
        rtol=1e-6,
    )


def test_more_clusters_than_distinct_rows_leaves_empty_clusters_finite():
  # Two distinct rows, four clusters: k-means++ can only draw duplicates
  # after the first two centres, whose clusters end empty.
  rows = np.array([[1.0, 1.0], [1.0, 1.0], [5.0, 5.0]], np.float32)

  result = clustering.kmeans(rows, 4, _SEED)

  centroids = result.centroids.numpy()
  assert centroids.shape == (4, 2)
  assert np.all(np.isfinite(centroids))
  # Every centroid is one of the rows, and every row decodes to itself.
  for centroid in centroids:
    assert any(np.array_equal(centroid, row) for row in rows)
  np.testing.assert_array_equal(centroids[result.assignments], rows)


def test_kmeans_with_no_real_row_is_finite():
  rows = np.ones([3, 2], np.float32)

  result = clustering.kmeans(rows, 2, _SEED, row_mask=[0, 0, 0])

  assert np.all(np.isfinite(result.centroids))
  np.testing.assert_array_equal(result.assignments, [-1, -1, -1])


def test_kmeans_traces_once_for_a_tensor_k_and_unknown_row_count():
  rows, labels = _clustered_rows(4, sizes=[3, 4, 2, 5])
  compiled = tf.function(
      clustering.kmeans,
      input_signature=[
          tf.TensorSpec([None, 3], tf.float32),
          tf.TensorSpec([], tf.int32),
          tf.TensorSpec([2], tf.int64),
      ],
  )

  for k in (4, 2):
    got = compiled(rows, k, _SEED)
    eager = clustering.kmeans(rows, k, _SEED)
    assert got.centroids.shape == (k, 3)
    np.testing.assert_allclose(got.centroids, eager.centroids, rtol=1e-6)
    np.testing.assert_array_equal(got.assignments, eager.assignments)
  _assert_same_partition(compiled(rows, 4, _SEED).assignments.numpy(), labels)
  assert compiled.experimental_get_tracing_count() == 1


def test_one_cluster_traces_in_a_graph_and_is_the_mean():
  rows = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 0.0]], np.float32)

  @tf.function
  def one_cluster(x):
    return clustering.kmeans(x, 1, seed=[0, 1]).centroids

  # The only centroid of k = 1 is the mean of the rows.
  np.testing.assert_allclose(one_cluster(rows), [[3.0, 2.0]], rtol=1e-6)
