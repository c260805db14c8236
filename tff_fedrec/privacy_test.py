"""Tests of the Laplace noise of local differential privacy (Sec. 6.6)."""

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec import privacy

_NUM_SAMPLES = 400_000


def _seed(a, b):
  return tf.constant([a, b], tf.int64)


@pytest.mark.parametrize('scale', [0.1, 2.0])
def test_mean_variance_and_tails_of_laplace(scale):
  noise = privacy.laplace_noise([_NUM_SAMPLES], scale, _seed(0, 1)).numpy()
  noise = noise.astype(np.float64)

  # Laplace(0, b): mean 0, variance 2 b^2, E|x| = b, P(|x| > t) = exp(-t / b).
  # With n = 4e5 the sample mean has std sqrt(2 / n) b ~ 0.0022 b, so 0.02 b
  # is ~9 sigma; the sample variance has relative std sqrt(5 / n) ~ 0.0035
  # (kurtosis 6), so 5% is > 10 sigma.
  assert abs(noise.mean()) < 0.02 * scale
  np.testing.assert_allclose(noise.var(), 2 * scale**2, rtol=0.05)
  np.testing.assert_allclose(np.abs(noise).mean(), scale, rtol=0.02)
  # A Gaussian of the same variance would put only 0.5% beyond 2b, the
  # Laplace puts exp(-2) = 13.5%.
  np.testing.assert_allclose(
      np.mean(np.abs(noise) > 2 * scale), np.exp(-2.0), rtol=0.05
  )


def test_shape_and_dtype():
  noise = privacy.laplace_noise([3, 5], 1.0, _seed(0, 1))

  assert noise.shape == (3, 5)
  assert noise.dtype == tf.float32


def test_deterministic_per_seed():
  first = privacy.laplace_noise([1000], 1.0, _seed(7, 3))
  again = privacy.laplace_noise([1000], 1.0, _seed(7, 3))

  np.testing.assert_array_equal(first, again)


def test_different_across_seeds():
  first = privacy.laplace_noise([1000], 1.0, _seed(7, 3)).numpy()
  other = privacy.laplace_noise([1000], 1.0, _seed(7, 4)).numpy()

  # Two independent continuous samples never agree element-wise.
  assert not np.any(first == other)


def test_finite_even_in_the_extreme_tails():
  noise = privacy.laplace_noise([2_000_000], 3.0, _seed(11, 12)).numpy()

  assert np.all(np.isfinite(noise))
  # |u| <= 1/2 - 1e-7 (rounded in float32 to 1/2 - 3 * 2^-25) gives
  # |x| = -b log(1 - 2|u|) <= -b log(1.8e-7) = 15.5 b.
  assert np.abs(noise).max() < 3.0 * 16


def test_usable_inside_tf_function_with_dynamic_shape():
  @tf.function
  def noisy(values, seed):
    return values + privacy.laplace_noise(tf.shape(values), 0.5, seed)

  values = tf.zeros([4, 3])
  got = noisy(values, _seed(1, 2))

  np.testing.assert_array_equal(
      got, privacy.laplace_noise([4, 3], 0.5, _seed(1, 2))
  )
