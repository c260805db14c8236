"""Tests of the decorrelation regulariser (HeteFedRec Eq. 13) and Eq. 12."""

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec.algorithms.hetefedrec import decorrelation


def _numpy_loss(table):
  """||corrcoef||_F / N of the columns of table [T, N], in float64."""
  correlation = np.corrcoef(table.astype(np.float64), rowvar=False)
  return np.linalg.norm(correlation) / table.shape[1]


def _random_rows(seed, shape):
  rng = np.random.default_rng(seed)
  return rng.normal(size=shape).astype(np.float32)


@pytest.mark.parametrize('num_rows,width', [(2, 2), (20, 6), (50, 32)])
def test_unmasked_matches_numpy_corrcoef(num_rows, width):
  table = _random_rows(0, (num_rows, width))

  got = decorrelation.decorrelation_loss(tf.constant(table))

  assert got.shape == ()
  assert got.dtype == tf.float32
  np.testing.assert_allclose(got, _numpy_loss(table), rtol=1e-5, atol=1e-5)


def test_masked_equals_unmasked_on_the_real_rows():
  table = _random_rows(1, (12, 5))
  mask = np.array([1, 0, 1, 1, 0, 1, 1, 1, 0, 0, 1, 1], np.float32)
  # Padding rows far off the real ones would dominate any statistic that
  # let them in.
  table[mask == 0] = 1e3

  got = decorrelation.decorrelation_loss(tf.constant(table), tf.constant(mask))
  real_only = decorrelation.decorrelation_loss(tf.constant(table[mask == 1]))

  np.testing.assert_allclose(got, real_only, rtol=1e-6)
  np.testing.assert_allclose(
      got, _numpy_loss(table[mask == 1]), rtol=1e-5, atol=1e-5
  )


def test_batched_equals_per_item_calls():
  rows = _random_rows(2, (2, 9, 4))
  mask = np.ones([2, 9], np.float32)
  mask[1, 6:] = 0.0  # The second user has 6 real rows and 3 padding rows.

  got = decorrelation.decorrelation_loss(tf.constant(rows), tf.constant(mask))

  assert got.shape == (2,)
  for user in range(2):
    one = decorrelation.decorrelation_loss(
        tf.constant(rows[user]), tf.constant(mask[user])
    )
    np.testing.assert_allclose(got[user], one, rtol=1e-6)
  np.testing.assert_allclose(
      got, [_numpy_loss(rows[0]), _numpy_loss(rows[1, :6])], rtol=1e-5
  )


def test_batched_without_a_mask_matches_numpy_per_user():
  rows = _random_rows(3, (3, 7, 4))

  got = decorrelation.decorrelation_loss(tf.constant(rows))

  assert got.shape == (3,)
  np.testing.assert_allclose(
      got, [_numpy_loss(user_rows) for user_rows in rows], rtol=1e-5
  )


def test_a_nearly_constant_column_is_damped_by_epsilon():
  # One column [a, -a]: variance a^2, standardized +-a / sqrt(a^2 + 1e-8),
  # correlation a^2 / (a^2 + 1e-8). With a^2 = 1e-8 that is 1/2, and the
  # loss ||C||_F / 1 = 1/2 (below 1, where a norm guard at 1 would zero it).
  a = 1e-4
  got = decorrelation.decorrelation_loss(tf.constant([[a], [-a]], tf.float32))
  np.testing.assert_allclose(got, 0.5, rtol=1e-3)


def test_orthogonal_standardized_columns_give_one_over_sqrt_width():
  # The columns of a Sylvester-Hadamard matrix H_8 are +-1 and orthogonal;
  # all but the first (all ones) have mean 0 and population variance 1. So
  # for N of them Z = V, C = V^T V / 8 = I_N, ||I_N||_F = sqrt(N), and the
  # loss is sqrt(N) / N = 1 / sqrt(N). Shifting and scaling each column
  # leaves Z, hence the loss, unchanged.
  hadamard = np.array([[1.0]])
  for _ in range(3):
    hadamard = np.block([[hadamard, hadamard], [hadamard, -hadamard]])
  width = 5
  table = hadamard[:, 1 : 1 + width]
  shifted = table * np.arange(1, width + 1) + np.arange(width) * 10.0

  for rows in (table, shifted):
    got = decorrelation.decorrelation_loss(tf.constant(rows, tf.float32))
    np.testing.assert_allclose(got, 1 / np.sqrt(width), rtol=1e-6)


def test_duplicated_columns_give_a_larger_loss():
  table = _random_rows(3, (30, 4))
  duplicated = table.copy()
  duplicated[:, 3] = duplicated[:, 0]
  # N copies of one column: every |C_ij| = 1, ||C||_F = N, the loss is 1.
  collapsed = np.repeat(table[:, :1], 4, axis=1)

  base = decorrelation.decorrelation_loss(tf.constant(table))
  with_duplicate = decorrelation.decorrelation_loss(tf.constant(duplicated))
  fully_collapsed = decorrelation.decorrelation_loss(tf.constant(collapsed))

  assert with_duplicate > base
  np.testing.assert_allclose(fully_collapsed, 1.0, rtol=1e-5)


def _loss_and_gradient(rows, mask=None):
  rows = tf.constant(rows, tf.float32)
  with tf.GradientTape() as tape:
    tape.watch(rows)
    loss = tf.reduce_sum(decorrelation.decorrelation_loss(rows, mask))
  return loss.numpy(), tape.gradient(loss, rows).numpy()


def test_a_constant_column_gives_a_finite_loss_and_gradient():
  table = _random_rows(4, (10, 3))
  table[:, 1] = 2.5

  loss, gradient = _loss_and_gradient(table)

  # The constant column adds nothing to C: the loss is that of the other
  # two columns' correlation matrix, divided by N = 3 rather than 2.
  expected = _numpy_loss(table[:, [0, 2]]) * 2 / 3
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  assert np.all(np.isfinite(gradient))


@pytest.mark.parametrize(
    'mask',
    [
        pytest.param(None, id='one row'),
        pytest.param(np.zeros([1], np.float32), id='no real row'),
    ],
)
def test_one_or_no_real_row_gives_zero_loss_and_zero_gradient(mask):
  loss, gradient = _loss_and_gradient(_random_rows(5, (1, 4)), mask)

  assert loss == 0.0
  np.testing.assert_array_equal(gradient, np.zeros([1, 4]))


def test_batch_with_degenerate_users_keeps_other_gradients():
  rows = _random_rows(6, (3, 5, 4))
  mask = np.array(
      [[1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], np.float32
  )

  loss, gradient = _loss_and_gradient(rows, tf.constant(mask))

  np.testing.assert_allclose(loss, _numpy_loss(rows[0]), rtol=1e-5)
  assert np.all(np.isfinite(gradient))
  assert np.any(gradient[0] != 0)
  np.testing.assert_array_equal(gradient[1:], 0.0)


def test_gradient_descent_decorrelates():
  table = _random_rows(7, (40, 4))
  table[:, 1] = table[:, 0] + 0.1 * table[:, 1]
  rows = tf.Variable(table)
  before = decorrelation.decorrelation_loss(rows).numpy()

  for _ in range(20):
    with tf.GradientTape() as tape:
      loss = decorrelation.decorrelation_loss(rows)
    rows.assign_sub(0.5 * tape.gradient(loss, rows))

  assert decorrelation.decorrelation_loss(rows).numpy() < before


def test_works_inside_tf_function():
  rows = _random_rows(8, (2, 6, 3))
  mask = np.ones([2, 6], np.float32)
  mask[0, 4:] = 0.0
  compiled = tf.function(decorrelation.decorrelation_loss)

  eager = decorrelation.decorrelation_loss(rows, mask)
  for _ in range(2):
    np.testing.assert_allclose(compiled(rows, mask), eager, rtol=1e-6)
  np.testing.assert_allclose(
      compiled(rows[0]), decorrelation.decorrelation_loss(rows[0]), rtol=1e-6
  )


def test_singular_value_variance_by_hand():
  # Uncorrelated columns with sample variances (ddof = 1) 2/3 and 8/3: the
  # covariance matrix is diag(2/3, 8/3), its singular values are 8/3 and
  # 2/3 with mean 5/3, and their variance is (1^2 + 1^2) / 2 = 1.
  table = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 2.0], [0.0, -2.0]])

  assert decorrelation.singular_value_variance(table) == pytest.approx(1.0)


def test_singular_value_variance_is_rotation_invariant():
  # Rotating the columns by R turns the covariance S into R^T S R, which has
  # the same singular values, although it is no longer diagonal.
  table = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 2.0], [0.0, -2.0]])
  angle = 0.3
  rotation = np.array(
      [[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]]
  )

  got = decorrelation.singular_value_variance(table @ rotation)

  assert got == pytest.approx(1.0)


def test_singular_value_variance_of_equal_dimensions_is_zero():
  # These +-1 columns have mean 0, are orthogonal and have sample variance
  # 4/3, so the covariance is (4/3) I and its singular values are all equal;
  # a single column has a single singular value.
  table = np.array(
      [[1, 1, 1], [-1, 1, -1], [1, -1, -1], [-1, -1, 1]], np.float64
  )

  assert decorrelation.singular_value_variance(table) == pytest.approx(0.0)
  assert decorrelation.singular_value_variance(table[:, :1]) == 0.0


def test_singular_value_variance_takes_two_rows():
  # Two rows [1, 3] and [-1, -3]: covariance [[2, 6], [6, 18]], singular
  # values 20 and 0, variance 100.
  table = np.array([[1.0, 3.0], [-1.0, -3.0]])
  assert decorrelation.singular_value_variance(table) == pytest.approx(100.0)


def test_singular_value_variance_rejects_bad_shapes():
  with pytest.raises(ValueError, match='I >= 2'):
    decorrelation.singular_value_variance(np.ones([1, 3]))
  with pytest.raises(ValueError, match='I >= 2'):
    decorrelation.singular_value_variance(np.ones([3]))
