"""The degree of data heterogeneity P and APFR-GKD's adapter (Zhao et al.).

APFR-GKD Sec. 5.1: cluster user preference vectors with k-means into k
centres c_1..c_k and take their mean pairwise Euclidean distance

  P = [sum_{i<j} d(c_i, c_j)] / (k (k - 1) / 2)                   (Eq. 4)
  d(c_i, c_j) = sqrt(sum_m (c_im - c_jm)^2)                        (Eq. 5)

The Personalization Adapter (Algorithm 1) runs Unary (distillation only)
when P < epsilon and Dual (a PFedRec-style phase, then distillation) else.

The paper names neither the preference vectors, nor k, nor the sample
D_s (docs/methods/apfr_gkd.md); the choices here:
- preference vectors: the users' rows of the rank-m truncated SVD of the
  binary user x item matrix of training interactions (U_m S_m, the user
  factors of matrix factorisation, which need no training), each
  dimension standardised to mean 0 and variance 1/m over the users (a
  user vector has mean squared norm 1 whatever m is, so P does not grow
  with sqrt(m));
- k = 10 clusters, m = 32 (the embedding size of Sec. 6.3);
- D_s: every user (`sample_users` draws a subset).
The paper's own values (AED, Table 1: ML-100K 1.939, ML-1M 1.905, Lastfm
2.106, Amazon 2.041, epsilon between 1.939 and 2.041) therefore do not
carry over to these P; the adapter's threshold is a flag.
"""

from typing import Optional

import numpy as np
import tensorflow as tf

from tff_fedrec import clustering

DEFAULT_NUM_CLUSTERS = 10
_SUBSPACE_ITERATIONS = 30
DEFAULT_DIM = 32
# Spec section 7.8: any threshold in (1.939, 2.041) reproduces the paper's
# choices on its own AED values.
DEFAULT_THRESHOLD = 2.0
MODES = ('unary', 'dual')


def mean_pairwise_centroid_distance(centroids: np.ndarray) -> float:
  """Eq. 4-5: the mean Euclidean distance over the k (k - 1) / 2 pairs of
  rows of `centroids` [k, m], k >= 2."""
  centroids = np.asarray(centroids, np.float64)
  k = centroids.shape[0]
  if k < 2:
    raise ValueError(f'P needs at least 2 centres; got {k}.')
  total = 0.0
  for i in range(k):
    for j in range(i + 1, k):
      total += np.sqrt(np.sum((centroids[i] - centroids[j]) ** 2))
  return total / (k * (k - 1) / 2)


def _top_eigenpairs(gram: np.ndarray, rank: int, seed: int):
  """The `rank` largest eigenvalues [rank] and eigenvectors [n, rank] of
  the symmetric PSD `gram` [n, n]: subspace iteration (Golub & Van Loan
  Sec. 8.2.4) on rank + 8 vectors, then Rayleigh-Ritz; a full `eigh` of
  ML-1M's 3,706 x 3,706 Gram matrix takes 19 s here, this under 1 s."""
  size = gram.shape[0]
  width = min(size, rank + 8)
  basis = np.random.default_rng(seed).normal(size=(size, width))
  for _ in range(_SUBSPACE_ITERATIONS):
    basis, _ = np.linalg.qr(gram @ basis)
  values, vectors = np.linalg.eigh(basis.T @ gram @ basis)
  top = np.argsort(values)[::-1][:rank]
  return values[top], basis @ vectors[:, top]


def preference_vectors(
    train_offsets: np.ndarray,
    train_items: np.ndarray,
    num_items: int,
    *,
    dim: int = DEFAULT_DIM,
    seed: int = 0,
) -> np.ndarray:
  """Rank-`dim` SVD user factors [U, dim'] of the binary interaction matrix
  A, dim' = min(dim, U, I), each standardised to mean 0 and variance
  1 / dim' over the users (module docstring).

  From the smaller Gram matrix: A A^T = U S^2 U^T (U <= I), or
  A^T A = V S^2 V^T and U S = A V. The sign of each factor is fixed by its
  largest entry being positive.
  """
  counts = np.diff(np.asarray(train_offsets))
  num_users = counts.size
  matrix = np.zeros([num_users, num_items], np.float32)
  matrix[np.repeat(np.arange(num_users), counts),
         np.asarray(train_items)] = 1.0
  rank = min(dim, num_users, num_items)
  if num_users <= num_items:
    values, vectors = _top_eigenpairs(
        (matrix @ matrix.T).astype(np.float64), rank, seed)
    factors = vectors * np.sqrt(np.maximum(values, 0.0))
  else:
    _, vectors = _top_eigenpairs(
        (matrix.T @ matrix).astype(np.float64), rank, seed)
    factors = matrix.astype(np.float64) @ vectors
  largest = factors[np.argmax(np.abs(factors), axis=0),
                    np.arange(factors.shape[1])]
  factors = factors * np.where(largest < 0, -1.0, 1.0)
  spread = factors.std(axis=0) * np.sqrt(rank)
  return ((factors - factors.mean(axis=0))
          / np.where(spread > 0, spread, 1.0)).astype(np.float32)


def heterogeneity(
    train_offsets: np.ndarray,
    train_items: np.ndarray,
    num_items: int,
    *,
    num_clusters: int = DEFAULT_NUM_CLUSTERS,
    dim: int = DEFAULT_DIM,
    sample_users: Optional[int] = None,
    seed: int = 0,
) -> float:
  """P of the users' training interactions (CSR `train_offsets` [U + 1],
  `train_items`), Eq. 4-5 on k-means (`clustering.kmeans`, k-means++
  then Lloyd) centres of `preference_vectors`; over `sample_users` users
  drawn with `seed` if given (D_s), else all."""
  vectors = preference_vectors(train_offsets, train_items, num_items,
                               dim=dim, seed=seed)
  if sample_users is not None and sample_users < vectors.shape[0]:
    rng = np.random.default_rng(seed)
    vectors = vectors[np.sort(rng.choice(vectors.shape[0], sample_users,
                                         replace=False))]
  num_clusters = min(num_clusters, vectors.shape[0])
  result = clustering.kmeans(
      tf.constant(vectors), num_clusters,
      seed=tf.constant([seed, 4], tf.int64), num_iterations=50,
  )
  return mean_pairwise_centroid_distance(result.centroids.numpy())


def personalization_mode(p: float, threshold: float) -> str:
  """Algorithm 1's adapter: 'unary' if P < threshold, else 'dual'."""
  return 'unary' if p < threshold else 'dual'
