"""Distillation from a global teacher's scores (APFR-GKD, Zhao et al.).

APFR-GKD Eq. 7 softens a model's output with a temperature tau,

  h(theta, x) = exp(z(theta, x) / tau) / sum_d exp(z(theta, x) / tau),

and Eq. 8 adds mu * tau^2 * KL(h(teacher, x) || h(student, x)) to each
client's BCE loss, the teacher being the buffered global model (Eq. 6).
A recommender scores an item by one sigmoid logit, for which the sum over
d is not defined (docs/methods/apfr_gkd.md); two readings:

- `binary_kd_loss` (the default): the two-class distribution
  [sigmoid(z / tau), 1 - sigmoid(z / tau)] of every example, which is the
  softmax over [z / tau, 0]:
    KL = p_T log(p_T / p_S) + (1 - p_T) log((1 - p_T) / (1 - p_S));
- `listwise_kd_loss`: the softmax over one user's examples of a batch (its
  positives and sampled negatives), as a softmax over item scores.

Both return tau^2 * KL, the scale of Hinton et al. (2015) that Eq. 8
writes out, so the gradients keep their size as tau changes.
"""

import tensorflow as tf

DISTILLATION_KINDS = ('binary', 'listwise')


def binary_kd_loss(
    teacher_logits: tf.Tensor, student_logits: tf.Tensor, temperature: float
) -> tf.Tensor:
  """tau^2 * KL of the two-class distributions, per example.

  Args:
    teacher_logits: float32 [...], the teacher's logits z_T.
    student_logits: float32 [...], the student's logits z_S, same shape.
    temperature: tau > 0.

  Returns:
    float32 [...], >= 0, 0 where z_T = z_S.
  """
  t = teacher_logits / temperature
  s = student_logits / temperature
  p_teacher = tf.sigmoid(t)
  # log sigmoid(x) = -softplus(-x), log(1 - sigmoid(x)) = -softplus(x).
  kl = (p_teacher * (tf.nn.softplus(-s) - tf.nn.softplus(-t))
        + (1.0 - p_teacher) * (tf.nn.softplus(s) - tf.nn.softplus(t)))
  return temperature**2 * kl


def listwise_kd_loss(
    teacher_logits: tf.Tensor,
    student_logits: tf.Tensor,
    mask: tf.Tensor,
    temperature: float,
) -> tf.Tensor:
  """tau^2 * KL of the softmaxes over each row's real examples.

  Args:
    teacher_logits: float32 [U, B], one row per user.
    student_logits: float32 [U, B].
    mask: float32 [U, B], 1 for a real example, 0 for padding (excluded
      from both distributions).
    temperature: tau > 0.

  Returns:
    float32 [U]; 0 for a row without real examples.
  """
  padding = (1.0 - mask) * -1e9
  log_teacher = tf.nn.log_softmax(teacher_logits / temperature + padding)
  log_student = tf.nn.log_softmax(student_logits / temperature + padding)
  kl = tf.reduce_sum(
      mask * tf.exp(log_teacher) * (log_teacher - log_student), axis=-1
  )
  return temperature**2 * kl
