"""Tests of the distillation losses against numpy written from Eq. 7-8."""

import numpy as np
import tensorflow as tf

from tff_fedrec.algorithms.apfr_gkd import kd_loss


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _numpy_binary(teacher, student, tau):
  """Eq. 7 over the two classes {1, 0}, then tau^2 KL(teacher || student)."""
  p = _sigmoid(teacher / tau)
  q = _sigmoid(student / tau)
  return tau**2 * (p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q)))


def _numpy_listwise(teacher, student, mask, tau):
  out = []
  for t, s, m in zip(teacher, student, mask):
    real = m > 0
    if not real.any():
      out.append(0.0)
      continue
    p = np.exp(t[real] / tau) / np.exp(t[real] / tau).sum()
    q = np.exp(s[real] / tau) / np.exp(s[real] / tau).sum()
    out.append(tau**2 * np.sum(p * np.log(p / q)))
  return np.array(out)


_TEACHER = np.array([[2.0, -1.0, 0.5, 3.0], [-2.0, 1.5, 0.0, -0.5]])
_STUDENT = np.array([[0.5, -2.0, 1.5, 1.0], [-1.0, 0.5, 0.3, -3.0]])


def test_binary_loss_matches_numpy_at_several_temperatures():
  for tau in (0.5, 1.0, 3.0):
    got = kd_loss.binary_kd_loss(
        tf.constant(_TEACHER, tf.float32), tf.constant(_STUDENT, tf.float32),
        tau,
    ).numpy()
    np.testing.assert_allclose(got, _numpy_binary(_TEACHER, _STUDENT, tau),
                               rtol=1e-5, atol=1e-6)


def test_binary_loss_is_teacher_to_student_not_the_reverse():
  forward = kd_loss.binary_kd_loss(
      tf.constant(_TEACHER, tf.float32), tf.constant(_STUDENT, tf.float32),
      1.0).numpy()
  reverse = _numpy_binary(_STUDENT, _TEACHER, 1.0)
  assert np.abs(forward - reverse).max() > 1e-2
  np.testing.assert_allclose(
      kd_loss.binary_kd_loss(
          tf.constant(_TEACHER, tf.float32), tf.constant(_TEACHER, tf.float32),
          2.0).numpy(),
      0.0, atol=1e-6)


def test_binary_gradient_pulls_the_student_towards_the_teacher():
  student = tf.Variable(_STUDENT, dtype=tf.float32)
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(kd_loss.binary_kd_loss(
        tf.constant(_TEACHER, tf.float32), student, 2.0))
  gradient = tape.gradient(loss, student).numpy()
  # d/ds tau^2 KL = tau (sigmoid(s / tau) - sigmoid(t / tau)).
  np.testing.assert_allclose(
      gradient, 2.0 * (_sigmoid(_STUDENT / 2) - _sigmoid(_TEACHER / 2)),
      rtol=1e-5, atol=1e-6)


def test_listwise_loss_matches_numpy_and_ignores_padding():
  mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)
  for tau in (1.0, 2.0):
    got = kd_loss.listwise_kd_loss(
        tf.constant(_TEACHER, tf.float32), tf.constant(_STUDENT, tf.float32),
        tf.constant(mask), tau).numpy()
    np.testing.assert_allclose(
        got, _numpy_listwise(_TEACHER, _STUDENT, mask, tau), rtol=1e-5,
        atol=1e-6)
  # A shift of all of a user's logits leaves a softmax unchanged (not the
  # binary reading).
  shifted = kd_loss.listwise_kd_loss(
      tf.constant(_TEACHER, tf.float32), tf.constant(_TEACHER + 5.0,
                                                     tf.float32),
      tf.constant(mask), 1.0).numpy()
  np.testing.assert_allclose(shifted, 0.0, atol=1e-5)


def test_listwise_loss_of_a_row_without_examples_is_zero():
  got = kd_loss.listwise_kd_loss(
      tf.constant(_TEACHER, tf.float32), tf.constant(_STUDENT, tf.float32),
      tf.zeros([2, 4]), 1.0).numpy()
  np.testing.assert_allclose(got, 0.0, atol=1e-6)
