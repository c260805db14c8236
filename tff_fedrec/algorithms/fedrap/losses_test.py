"""Tests of FedRAP's batch loss against a numpy reading of the reference
code's `Loss` (BCE_mean - lambda MSE_mean(D_b, C_b) + mu L1_mean(C_b))."""

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec.algorithms.fedrap import losses

_LAM, _MU = 0.3, 0.7


def _inputs():
  """Two users, batch of 4 slots, d = 3; user 1 has 2 real examples."""
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 4)).astype(np.float32)
  labels = np.array([[1, 0, 0, 1], [0, 1, 1, 1]], np.float32)
  personal = rng.normal(size=(2, 4, 3)).astype(np.float32)
  shared = rng.normal(size=(2, 4, 3)).astype(np.float32)
  mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], np.float32)
  return logits, labels, personal, shared, mask


def _reference(logits, labels, personal, shared, mask, *, lam, mu,
               reduce=np.mean, lam_sign=-1.0, l1_rows=None):
  """Per user: the formula on its real examples only."""
  result = []
  for u in range(logits.shape[0]):
    real = mask[u] > 0
    z, y = logits[u][real], labels[u][real]
    p = 1.0 / (1.0 + np.exp(-z))
    bce = reduce(-(y * np.log(p) + (1 - y) * np.log(1 - p)))
    mse = reduce((personal[u][real] - shared[u][real]) ** 2)
    l1_source = shared[u][real] if l1_rows is None else l1_rows[u]
    l1 = reduce(np.abs(l1_source))
    result.append(bce + lam_sign * lam * mse + mu * l1)
  return np.array(result)


def _loss(*inputs, lam=_LAM, mu=_MU):
  return losses.batch_losses(
      *[tf.constant(x) for x in inputs], lam=lam, mu=mu
  ).numpy()


def test_batch_losses_match_the_formula():
  inputs = _inputs()
  np.testing.assert_allclose(
      _loss(*inputs), _reference(*inputs, lam=_LAM, mu=_MU), rtol=1e-5
  )


@pytest.mark.parametrize('wrong', [
    dict(lam_sign=+1.0),                      # + lambda MSE
    dict(reduce=np.sum),                      # sums instead of means
    dict(l1_rows='all'),                      # L1 over every slot, padding too
])
def test_the_inputs_tell_plausible_mistakes_apart(wrong):
  inputs = _inputs()
  if wrong.get('l1_rows') == 'all':
    wrong = dict(l1_rows=inputs[3])
  mistaken = _reference(*inputs, lam=_LAM, mu=_MU, **wrong)
  assert np.max(np.abs(_loss(*inputs) - mistaken)) > 1e-2


def test_a_user_without_examples_has_zero_loss():
  logits, labels, personal, shared, _ = _inputs()
  mask = np.array([[1, 1, 1, 1], [0, 0, 0, 0]], np.float32)
  assert _loss(logits, labels, personal, shared, mask)[1] == 0.0


def test_gradient_pushes_personal_rows_away_from_the_global_ones():
  # With lambda only, the gradient on D is -2 lambda (D - C) / (n d).
  _, labels, personal, shared, mask = _inputs()
  personal = tf.constant(personal)
  with tf.GradientTape() as tape:
    tape.watch(personal)
    total = tf.reduce_sum(losses.batch_losses(
        tf.zeros([2, 4]), labels, personal, shared, mask, lam=_LAM, mu=0.0))
  grad = tape.gradient(total, personal).numpy()
  counts = mask.sum(axis=1)[:, None, None]
  expected = -2 * _LAM * (personal.numpy() - shared) / (counts * 3)
  np.testing.assert_allclose(grad, expected * mask[..., None], rtol=1e-5)


def test_regularization_weights_fixed_and_tanh():
  assert [float(w) for w in losses.regularization_weights(
      0.1, 0.2, 7, 'fixed')] == pytest.approx([0.1, 0.2])
  lam, mu = losses.regularization_weights(0.1, 0.2, 5, 'tanh')
  assert float(lam) == pytest.approx(0.1 * np.tanh(0.5))
  assert float(mu) == pytest.approx(0.2 * np.tanh(0.5))
  assert float(losses.regularization_weights(0.1, 0.2, 0, 'tanh')[0]) == 0.0
  with pytest.raises(ValueError, match='schedule'):
    losses.regularization_weights(0.1, 0.2, 0, 'sin')
