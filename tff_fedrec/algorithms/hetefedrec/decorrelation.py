"""Dimensional decorrelation of item embeddings (HeteFedRec, Yuan et al. 2024).

HeteFedRec Sec. IV.B: unified dual-task learning (Eq. 11) trains the first
N_s columns of the medium and large item tables on the small model's task,
which can collapse the larger tables onto those columns. Clients of the
medium and large tiers therefore add alpha * L_reg(V) (Eq. 14), the
decorrelation regulariser of Eq. 13, to their loss:

  L_reg(V) = ||corr((V - mean(V)) / sqrt(var(V)))||_F / N.

Eq. 12 measures the collapse directly, as the variance of the singular
values of V's covariance matrix; the paper reports it in Table V and
penalises Eq. 13 instead because the SVD is expensive.
"""

import numpy as np
import tensorflow as tf

# Inside the sqrt of the standardisation, so a constant column (variance 0)
# standardises to 0 rather than 0/0. Small against the variance of trained
# or initialised embeddings (of order 1 here), so it moves the loss of a
# non-constant column by a relative 1e-8 / variance only.
_EPSILON = 1e-8


def _safe_norm(squares_sum: tf.Tensor) -> tf.Tensor:
  """sqrt(squares_sum) with a zero (not NaN) gradient where it is 0."""
  positive = squares_sum > 0
  # sqrt's gradient at 0 is infinite, and 0 * inf is NaN even when the
  # branch is not taken, so the sqrt only ever sees positive values.
  return tf.where(
      positive, tf.sqrt(tf.where(positive, squares_sum, 1.0)), 0.0
  )


def decorrelation_loss(
    rows: tf.Tensor, mask: tf.Tensor | None = None
) -> tf.Tensor:
  """The dimensional decorrelation regulariser L_reg, HeteFedRec Eq. 13.

  Each of the N columns is standardised over the real rows, with the mean
  and the population variance (dividing by n, the number of real rows):
  Z = (V - mean) / sqrt(var + eps). The correlation matrix is
  C = Z^T Z / n [N, N], and the loss is ||C||_F / N.

  For real rows whose columns are all non-constant, C is the Pearson
  correlation matrix (as `np.corrcoef(V, rowvar=False)`), so its diagonal is
  1 and the loss lies in [1 / sqrt(N), 1]: 1 / sqrt(N) when the columns are
  uncorrelated (C = I), 1 when they are all perfectly correlated (every
  |C_ij| = 1). Minimising it decorrelates the columns.

  Degenerate cases give a finite loss and a finite gradient: a constant
  column standardises to 0, so it adds nothing to C (its diagonal entry is
  0, not 1); with n = 0 or 1 real rows every column is constant, so C = 0
  and the loss is 0, with a zero gradient.

  Example: the columns of [[1, 1], [1, -1], [-1, 1], [-1, -1]] have mean 0,
  variance 1 and are orthogonal, so C = I_2 and the loss is
  sqrt(2) / 2 = 0.7071.

  Args:
    rows: float32 [..., T, N], T item rows of embedding tables of width N,
      with any leading batch dimensions, e.g. [U, T, N] for U users each
      with its own rows.
    mask: float32 [..., T], 1 for a real row and 0 for padding, which is
      ignored; None means every row is real.

  Returns:
    float32 [...], the loss of each leading index.
  """
  rows = tf.convert_to_tensor(rows, tf.float32)
  if mask is None:
    mask = tf.ones(tf.shape(rows)[:-1], tf.float32)
  weights = tf.expand_dims(tf.convert_to_tensor(mask, tf.float32), -1)
  num_real = tf.reduce_sum(weights, axis=-2, keepdims=True)
  # With no real rows the sums below are 0 anyway; this avoids 0 / 0.
  divisor = tf.maximum(num_real, 1.0)
  mean = tf.reduce_sum(rows * weights, axis=-2, keepdims=True) / divisor
  centered = (rows - mean) * weights
  variance = tf.reduce_sum(tf.square(centered), axis=-2, keepdims=True) / (
      divisor
  )
  standardized = centered / tf.sqrt(variance + _EPSILON)
  correlation = (
      tf.matmul(standardized, standardized, transpose_a=True) / divisor
  )
  width = tf.cast(tf.shape(rows)[-1], tf.float32)
  return (
      _safe_norm(tf.reduce_sum(tf.square(correlation), axis=[-2, -1]))
      / width
  )


def singular_value_variance(table: np.ndarray) -> float:
  """The dimensional-collapse diagnostic L_singular, HeteFedRec Eq. 12.

  The population variance (1/N sum_i (lambda_i - mean(lambda))^2) of the N
  singular values lambda of the covariance matrix of the table's columns,
  `np.cov(table, rowvar=False)` [N, N]. Table V reports it for V_l: smaller
  means the dimensions are of more equal importance, i.e. less collapse.

  Example: the columns of [[1, 0], [-1, 0], [0, 2], [0, -2]] are
  uncorrelated with sample variances 2/3 and 8/3, so lambda = (8/3, 2/3)
  and the variance is ((8/3 - 5/3)^2 + (2/3 - 5/3)^2) / 2 = 1.

  Args:
    table: float [I, N], I >= 2 item embeddings of width N.

  Returns:
    The variance of the singular values; 0 when N = 1.

  Raises:
    ValueError: if table is not 2-D with at least 2 rows.
  """
  table = np.asarray(table, dtype=np.float64)
  if table.ndim != 2 or table.shape[0] < 2:
    raise ValueError(
        f'table must be [I, N] with I >= 2 rows; got shape {table.shape}.'
    )
  # np.cov returns a 0-d array for a single column.
  covariance = np.atleast_2d(np.cov(table, rowvar=False))
  return float(np.var(np.linalg.svd(covariance, compute_uv=False)))
