"""APFR-GKD's client round: the distillation term of a batch against numpy
(Eq. 7-8), what a user keeps and is scored with."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec import client_loop
from tff_fedrec import models
from tff_fedrec.algorithms.apfr_gkd import client_round
from tff_fedrec.algorithms.apfr_gkd import kd_loss


def _numpy_kd(teacher, student, mask, tau, kind):
  """tau^2 KL(teacher || student) of each user's real examples: the mean
  of the two-class KLs, or the KL of the softmaxes over its examples."""
  out = []
  for t, s, m in zip(teacher, student, mask.astype(bool)):
    t, s = t[m].astype(np.float64) / tau, s[m].astype(np.float64) / tau
    if kind == 'binary':
      p, q = 1 / (1 + np.exp(-t)), 1 / (1 + np.exp(-s))
      kl = p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q))
      out.append(tau**2 * kl.mean() if kl.size else 0.0)
    else:
      p, q = np.exp(t) / np.exp(t).sum(), np.exp(s) / np.exp(s).sum()
      out.append(tau**2 * float(np.sum(p * np.log(p / q))) if t.size
                 else 0.0)
  return np.array(out)


@pytest.mark.parametrize('kind', kd_loss.DISTILLATION_KINDS)
@pytest.mark.parametrize('tau', [1.0, 3.0])
def test_the_distillation_term_is_eq_8_of_each_users_batch(kind, tau):
  rng = np.random.default_rng(0)
  # Two users, a batch of four; the second user's last two are padding.
  teacher = rng.normal(size=[2, 6]).astype(np.float32)
  student = rng.normal(size=[2, 4]).astype(np.float32)
  index = np.array([[5, 0, 2, 3], [1, 4, 0, 0]], np.int32)
  mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], np.float32)
  weights = np.array([0.7, 0.2], np.float32)
  term = client_round.distillation_term(
      tf.constant(teacher), tf.constant(weights), tau, kind)
  batch = client_loop.Batch(
      tf.constant(0), tf.constant(index), tf.constant(mask),
      {'teacher_logits': tf.gather(term.examples['teacher_logits'], index,
                                   batch_dims=1)})

  got = term.fn(tf.constant(student), batch).numpy()

  batch_teacher = np.take_along_axis(teacher, index, axis=1)
  np.testing.assert_allclose(
      got, weights * _numpy_kd(batch_teacher, student, mask, tau, kind),
      rtol=1e-5, atol=1e-7)
  assert np.all(got > 0)


def test_a_user_keeps_its_trained_model_and_is_scored_with_it():
  spec = models.RecommenderSpec('neural_cf', 5, 2, (3,),
                                personal_score_layers=False)
  params = models.initial_parameters(spec, 0)
  round_ = client_round.TrainedModelRound('own_model')
  state = round_.local_state(spec, params)
  assert list(state) == [client_round.TRAINED_SCORE_LAYERS,
                         client_round.HAS_OWN_MODEL]
  assert state[client_round.HAS_OWN_MODEL] == 0.0
  assert list(round_.data_fields(2)) == [client_round.OWN_ROWS]
  assert not client_round.TrainedModelRound('download').data_fields(2)

  # Two users: the first has trained (its own layers), the second not.
  mine = tf.nest.map_structure(lambda x: np.stack([x + 1.0, x + 2.0]),
                               params['score_layers'])
  local = collections.OrderedDict({
      client_round.TRAINED_SCORE_LAYERS: mine,
      client_round.HAS_OWN_MODEL: np.array([1.0, 0.0], np.float32)})
  layers = client_round.trained_score_layers(spec, local, params)
  for got, own, shared in zip(tf.nest.flatten(layers), tf.nest.flatten(mine),
                              tf.nest.flatten(params['score_layers'])):
    np.testing.assert_array_equal(got[0], own[0])
    np.testing.assert_array_equal(got[1], shared)
  # A model without shared score layers keeps none of its own.
  mf = models.RecommenderSpec('matrix_factorization', 5, 2)
  assert client_round.trained_score_layers(mf, {}, {}) is None
  assert list(round_.local_state(mf, models.initial_parameters(mf, 0))) == [
      client_round.HAS_OWN_MODEL]


def test_unknown_client_starts_and_options_are_refused():
  with pytest.raises(ValueError, match='client_start'):
    client_round.TrainedModelRound('elsewhere')
  with pytest.raises(ValueError, match='kind'):
    client_round.DistillationOptions(kind='soft')
  with pytest.raises(ValueError, match='temperature'):
    client_round.DistillationOptions(temperature=0.0)
