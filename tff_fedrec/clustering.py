"""k-means of the rows of a matrix, graph-mode TensorFlow.

Greedy k-means++ initialisation (Arthur & Vassilvitskii 2007, with
scikit-learn's greedy choice of the best of several candidates) and a fixed
number of Lloyd steps, on the real rows of a padded matrix, seeded
statelessly. Shared by FedRAS (Lu et al., KDD 2025), whose actions are the
centroids of an item-gradient clustering (`fedras.action_clustering`,
`fedras.cluster_and_split`), and APFR-GKD (Zhao et al.), whose degree of
heterogeneity P clusters the users' preference vectors
(`apfr_gkd.heterogeneity`).

Everything here is graph-mode TensorFlow (tf.while_loop, tf.cond, no Python
branching on tensor values), so it runs inside `tff.tensorflow.computation`
as well as eagerly and under tf.function.
"""

import collections

import tensorflow as tf

# A fixed count keeps the loop graph-safe and its cost predictable. On
# ML-1M-sized input (3,706 rows x 32 into 185 clusters) from a k-means++
# start, 20 steps bring the k-means objective to its converged value to 5
# significant digits for structureless Gaussian rows (22 of 3,706 rows still
# move at step 20, none by step 40); rows drawn around 185 centres converge
# within 10 steps.
DEFAULT_LLOYD_ITERATIONS = 20

KMeansResult = collections.namedtuple(
    'KMeansResult', ['centroids', 'assignments']
)
KMeansResult.__doc__ = """A k-means clustering of n rows of width d.

Fields:
  centroids: float32 [k, d]; mu_j is the mean of the real rows assigned to
    j, or, for a cluster that ends empty, the last centre it had.
  assignments: int32 [n], the cluster of each real row; -1 for padding.
"""

def row_weights(rows: tf.Tensor, row_mask) -> tf.Tensor:
  """float32 [n]: the row mask as 0/1 weights, all ones if None."""
  if row_mask is None:
    return tf.ones(tf.shape(rows)[:1], tf.float32)
  return tf.cast(tf.convert_to_tensor(row_mask), tf.float32)


def _sample_index(weights: tf.Tensor, uniform: tf.Tensor) -> tf.Tensor:
  """i with probability weights[i] / sum(weights), from uniform in [0, 1).

  Inverse-CDF sampling: the first i whose cumulative weight exceeds
  uniform * total. A row of weight 0 is never drawn when the total is
  positive. Needs n >= 1.
  """
  cumulative = tf.cumsum(weights)
  target = uniform * cumulative[-1]
  index = tf.searchsorted(cumulative, target[tf.newaxis], side='right')[0]
  # Rounding can leave target == total when uniform is just below 1.
  return tf.minimum(index, tf.size(weights) - 1)


def local_trials(num_clusters):
  """Candidates per centre of greedy k-means++: 2 + floor(ln k), as
  scikit-learn's `kmeans_plusplus` (and so its KMeans' default init)."""
  k = tf.cast(num_clusters, tf.float32)
  return 2 + tf.cast(tf.floor(tf.math.log(k)), tf.int32)


def _kmeans_plus_plus(
    rows: tf.Tensor, weights: tf.Tensor, num_clusters, seed
) -> tf.Tensor:
  """Greedy k-means++ centres [k, d] (Arthur & Vassilvitskii 2007, with
  scikit-learn's greedy choice).

  The first centre is a real row drawn uniformly; for each next one, L =
  `local_trials(k)` candidate real rows are drawn with probability
  proportional to their squared distance to the nearest centre so far (D^2
  sampling), and the candidate that leaves the smallest total squared
  distance, sum_i min(D_i^2, ||x_i - c||^2), becomes the centre, as
  scikit-learn does. Once every real row is a centre (fewer distinct real
  rows than k) all distances are 0, and the remaining centres are drawn
  uniformly from the real rows, duplicating some; their clusters then end
  empty rather than NaN.

  Draws: uniforms U = stateless_uniform([k, L], seed); the first centre
  takes U[0, 0], centre j its candidates from U[j, :], each by inverse-CDF
  sampling (`_sample_index`).
  """
  num_clusters = tf.convert_to_tensor(num_clusters, tf.int32)
  trials = local_trials(num_clusters)
  uniforms = tf.random.stateless_uniform(
      tf.stack([num_clusters, trials]), seed
  )
  num_rows, width = tf.shape(rows)[0], tf.shape(rows)[1]
  # With no real row at all every row is an equally (un)likely centre.
  fallback = tf.where(
      tf.reduce_sum(weights) > 0, weights, tf.ones([num_rows], tf.float32)
  )
  first = rows[_sample_index(fallback, uniforms[0, 0])]
  centres = tf.tensor_scatter_nd_update(
      tf.zeros([num_clusters, width], rows.dtype), [[0]], first[tf.newaxis]
  )
  nearest_sq = tf.reduce_sum(tf.square(rows - first), axis=1)

  def body(j, centres, nearest_sq):
    d2_weights = weights * nearest_sq
    sampling = tf.where(tf.reduce_sum(d2_weights) > 0, d2_weights, fallback)
    candidates = tf.map_fn(
        lambda uniform: _sample_index(sampling, uniform), uniforms[j],
        fn_output_signature=tf.int32,
    )
    # [L, n]: each candidate's squared distance to every row.
    distances = tf.reduce_sum(
        tf.square(rows[tf.newaxis] - tf.gather(rows, candidates)[:, None]),
        axis=2,
    )
    potentials = tf.reduce_sum(
        weights * tf.minimum(nearest_sq[tf.newaxis], distances), axis=1
    )
    best = tf.argmin(potentials, output_type=tf.int32)
    centres = tf.tensor_scatter_nd_update(
        centres, [[j]], rows[candidates[best]][tf.newaxis]
    )
    nearest_sq = tf.minimum(nearest_sq, distances[best])
    return j + 1, centres, nearest_sq

  _, centres, _ = tf.while_loop(
      lambda j, *_: j < num_clusters,
      body,
      (tf.constant(1), centres, nearest_sq),
  )
  return centres


def _nearest_centre(
    rows: tf.Tensor, centres: tf.Tensor, real: tf.Tensor
) -> tf.Tensor:
  """int32 [n]: argmin_j ||row - centre_j||^2, first j on ties; -1 padding."""
  # ||x - c||^2 = ||x||^2 - 2 x.c + ||c||^2; ||x||^2 is the same for every c
  # so it does not change the argmin, and [n, k] is all we materialise.
  scores = tf.reduce_sum(tf.square(centres), axis=1)[tf.newaxis, :] - 2.0 * (
      tf.matmul(rows, centres, transpose_b=True)
  )
  nearest = tf.argmin(scores, axis=1, output_type=tf.int32)
  return tf.where(real, nearest, -1)


def kmeans(
    rows: tf.Tensor,
    num_clusters,
    seed: tf.Tensor,
    row_mask: tf.Tensor | None = None,
    num_iterations: int = DEFAULT_LLOYD_ITERATIONS,
) -> KMeansResult:
  """k-means of the real rows of `rows` (the objective of FedRAS Sec. 2.1:
  sum_k sum_{i in G_k} ||x_i - mu_k||^2).

  Initialisation is greedy k-means++ (D^2 sampling, the best of
  `local_trials(k)` candidates per centre), seeded statelessly, so the
  result is a function of (rows, mask, k, seed). Greedy k-means++ rather
  than k uniformly drawn rows because the paper ran scikit-learn's KMeans
  (App. A.2), whose default init it is, and because uniform draws often
  put two centres in one well-separated cluster and none in another, which
  Lloyd's iterations cannot undo. Then `num_iterations` Lloyd steps (assign
  each real row to its nearest centre, move each centre to the mean of its
  rows), and a final assignment step so `assignments` are those of the
  returned centroids. A cluster left empty keeps its previous centre, so no
  0/0 arises. Padding rows (mask 0) neither pick nor move centres.

  Example: rows [[0, 0], [0, 1], [10, 0], [10, 1]] with k = 2 give the
  centroids {[0, 0.5], [10, 0.5]} and assignments pairing rows 0-1 and
  2-3, whichever cluster is numbered 0.

  Args:
    rows: float32 [n, d], n >= 1.
    num_clusters: k >= 1, a Python int or int32 scalar tensor.
    seed: int [2], the stateless seed of the k-means++ draws.
    row_mask: [n] bool or 0/1, the real rows; None means all are real.
    num_iterations: the fixed number of Lloyd steps, a Python int.

  Returns:
    A KMeansResult: centroids float32 [k, d], assignments int32 [n].
  """
  rows = tf.convert_to_tensor(rows, tf.float32)
  num_clusters = tf.convert_to_tensor(num_clusters, tf.int32)
  weights = row_weights(rows, row_mask)
  real = weights > 0
  centres = _kmeans_plus_plus(rows, weights, num_clusters, seed)

  def lloyd_step(i, centres):
    assignments = _nearest_centre(rows, centres, real)
    sums = tf.math.unsorted_segment_sum(rows, assignments, num_clusters)
    # Segment id -1 (padding) is dropped by unsorted_segment_sum.
    counts = tf.math.unsorted_segment_sum(weights, assignments, num_clusters)
    moved = sums / tf.maximum(counts, 1.0)[:, tf.newaxis]
    # tf.where broadcasts a [1, d] centre set to an unknown first size;
    # the loop needs the centres' shape unchanged (k = 1 failed to trace).
    return i + 1, tf.ensure_shape(
        tf.where(counts[:, tf.newaxis] > 0, moved, centres), centres.shape
    )

  _, centres = tf.while_loop(
      lambda i, _: i < num_iterations, lloyd_step, (tf.constant(0), centres)
  )
  return KMeansResult(centres, _nearest_centre(rows, centres, real))
