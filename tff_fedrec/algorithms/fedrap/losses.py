"""FedRAP's loss of one batch, as plain TF math (no `tff.*`).

The paper's objective (Li et al., ICLR 2024, arXiv 2301.09109, as
docs/methods/fedrap.md quotes it) is

  sum_i [ sum_j BCE(r_ij, r_hat_ij) - lambda ||D^(i) - C||_F^2 ] + mu ||C||_1

and the reference code (mtics/FedRAP, `Loss` with `regular='l1'`) computes,
per batch of n examples with items j_1..j_n,

  BCE_mean(r_hat, r) - lambda MSE_mean(D[j_b], C[j_b]) + mu L1_mean(C[j_b])

with the means over the batch's n rows (x d values; a row appears once per
example, duplicates included). This module is the latter, per user, with
padding masked out. The minus sign pushes the user's view away from the
global one; the L1 term makes C sparse.

The paper raises the weights over rounds with a curriculum
(`regularization_weights`, 'tanh': weight x tanh(round / 10)); the code
computes that ramp but reads the constants, so 'fixed' is the code's
behaviour.
"""

import tensorflow as tf

WEIGHT_SCHEDULES = ('fixed', 'tanh')


def regularization_weights(lam: float, mu: float, round_num,
                           schedule: str) -> tuple[tf.Tensor, tf.Tensor]:
  """(lambda_t, mu_t) of round `round_num` (0-based): the constants
  ('fixed', the reference code) or scaled by tanh(round / 10) ('tanh', the
  paper's curriculum)."""
  if schedule not in WEIGHT_SCHEDULES:
    raise ValueError(f'schedule must be one of {WEIGHT_SCHEDULES}; got '
                     f'{schedule!r}.')
  scale = tf.constant(1.0)
  if schedule == 'tanh':
    scale = tf.tanh(tf.cast(round_num, tf.float32) / 10.0)
  return lam * scale, mu * scale


def batch_losses(
    logits: tf.Tensor,
    labels: tf.Tensor,
    personal_rows: tf.Tensor,
    global_rows: tf.Tensor,
    mask: tf.Tensor,
    *,
    lam,
    mu,
) -> tf.Tensor:
  """Each user's loss of its batch (module docstring).

  Args:
    logits: float32 [U, B], affine(D_j + C_j) of each example.
    labels: float32 [U, B], r_ij in {0, 1}.
    personal_rows: float32 [U, B, d], D^(u)_j of each example's item.
    global_rows: float32 [U, B, d], C_j of each example's item.
    mask: float32 [U, B], 1 for user u's real examples, 0 for padding.
    lam, mu: lambda and mu (scalars).

  Returns:
    float32 [U]; 0 for a user without real examples.
  """
  count = tf.reduce_sum(mask, axis=1)
  dim = tf.cast(tf.shape(personal_rows)[-1], tf.float32)
  safe_count = tf.maximum(count, 1.0)

  def mean_over_rows(per_value):
    return tf.reduce_sum(
        tf.reduce_sum(per_value, axis=-1) * mask, axis=1
    ) / (safe_count * dim)

  bce = tf.reduce_sum(
      tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
      * mask, axis=1,
  ) / safe_count
  mse = mean_over_rows(tf.square(personal_rows - global_rows))
  l1 = mean_over_rows(tf.abs(global_rows))
  return bce - lam * mse + mu * l1
