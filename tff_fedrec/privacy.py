"""Local differential privacy for uploads (PFedRec Sec. 6.6).

theta^m <- theta^m + Laplace(0, lambda): zero-mean Laplace noise of scale
lambda added on the client to the item embedding before it is uploaded.
"""

import tensorflow as tf


def laplace_noise(shape, scale: float, seed: tf.Tensor) -> tf.Tensor:
  """Laplace(0, scale) samples of `shape` from the stateless `seed` (int64 [2]).

  Inverse-CDF sampling: for u ~ U(-1/2, 1/2),
  x = -scale * sign(u) * log(1 - 2|u|) has density exp(-|x|/scale)/(2 scale),
  mean 0 and variance 2 scale^2.
  """
  # Keep |u| < 1/2 strictly so the log stays finite.
  half_open = 0.5 - 1e-7
  u = tf.random.stateless_uniform(
      shape, seed=seed, minval=-half_open, maxval=half_open
  )
  return -scale * tf.sign(u) * tf.math.log1p(-2.0 * tf.abs(u))
