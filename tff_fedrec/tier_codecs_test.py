"""RF²'s update codecs against numpy readings of the spec (section 2), on
the same uniform draws, and their statistics."""

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec import tier_codecs

_SEED = (3, 4)


def _uniforms(shape, seed=_SEED):
  return tf.random.stateless_uniform(shape, seed).numpy()


def _numpy_quant(x, bits, u):
  low, high = x.min(), x.max()
  if low == high:
    return x
  scaled = (x - low) / (high - low) * (2**bits - 1)
  level = np.floor(scaled) + (u < scaled - np.floor(scaled))
  return low + level / (2**bits - 1) * (high - low)


def _numpy_quant_s(x, bits, u):
  high = np.abs(x).max()
  if high == 0:
    return x
  scaled = np.abs(x) / high * (2**bits - 1)
  level = np.floor(scaled) + (u < scaled - np.floor(scaled))
  return np.where(x > 0, 1.0, -1.0) * level / (2**bits - 1) * high


def _delta(seed=0, shape=(50, 8)):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=shape).astype(np.float32)
  x[rng.random(shape) < 0.4] = 0.0  # Rows a client did not touch.
  return x


@pytest.mark.parametrize('bits', [2, 4, 8, 16])
def test_quant_and_quant_s_match_numpy_on_the_same_draws(bits):
  x = _delta(bits)
  u = _uniforms(x.shape)
  np.testing.assert_allclose(
      tier_codecs.quantize(x, bits, _SEED).numpy(), _numpy_quant(x, bits, u),
      rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
      tier_codecs.quantize_separate_sign(x, bits, _SEED).numpy(),
      _numpy_quant_s(x, bits, u), rtol=1e-5, atol=1e-6)


def test_quant_s_keeps_exact_zeros_and_quant_does_not():
  x = _delta(1)
  zeros = x == 0
  quant_s = tier_codecs.quantize_separate_sign(x, 2, _SEED).numpy()
  quant = tier_codecs.quantize(x, 2, _SEED).numpy()
  assert np.all(quant_s[zeros] == 0)
  # Zero is not on Quant's 4-point grid between min and max here.
  assert np.mean(quant[zeros] != 0) > 0.5


@pytest.mark.parametrize('codec', [tier_codecs.quantize,
                                   tier_codecs.quantize_separate_sign])
def test_stochastic_rounding_is_unbiased(codec):
  # Mean of 400 seeds' decodings at 2 bits against the input: the rounding
  # error of one draw is at most one step (spread / 3), so the mean's
  # error is about step / (2 sqrt(400)); a biased rounding (the paper's
  # text: down with probability frac) would be off by up to a step.
  x = _delta(2, shape=(200,))
  step = (x.max() - x.min()) / 3
  mean = np.mean([codec(x, 2, (s, 9)).numpy() for s in range(400)], axis=0)
  assert np.max(np.abs(mean - x)) < 0.2 * step
  assert np.mean(np.abs(mean - x)) < 0.05 * step


def test_decoded_values_lie_on_the_grid():
  x = _delta(3)
  q = tier_codecs.quantize(x, 3, _SEED).numpy()
  levels = (q - x.min()) / (x.max() - x.min()) * 7
  np.testing.assert_allclose(levels, np.round(levels), atol=1e-4)
  assert len(np.unique(np.round(levels))) <= 8


def test_prune_zeroes_a_rate_of_the_elements_and_keeps_the_rest_unscaled():
  x = _delta(4, shape=(100, 40)) + 10.0  # No zeros of its own.
  u = _uniforms(x.shape)
  pruned = tier_codecs.prune(x, 0.75, _SEED).numpy()
  np.testing.assert_array_equal(pruned, np.where(u > 0.75, x, 0.0))
  assert abs(np.mean(pruned == 0) - 0.75) < 0.03


def test_untouched_settings_and_constant_tensors_pass_through():
  x = _delta(5)
  for result in (tier_codecs.prune(x, 0.0, _SEED),
                 tier_codecs.quantize(x, 32, _SEED),
                 tier_codecs.quantize_separate_sign(x, 32, _SEED)):
    np.testing.assert_array_equal(np.asarray(result), x)
  constant = np.full([4, 3], 0.5, np.float32)
  np.testing.assert_array_equal(
      tier_codecs.quantize(constant, 4, _SEED).numpy(), constant)
  zeros = np.zeros([4, 3], np.float32)
  np.testing.assert_array_equal(
      tier_codecs.quantize_separate_sign(zeros, 4, _SEED).numpy(), zeros)


def test_bad_settings_are_refused():
  with pytest.raises(ValueError, match='rate'):
    tier_codecs.prune(_delta(), 1.0, _SEED)
  with pytest.raises(ValueError, match='bits'):
    tier_codecs.quantize(_delta(), 0, _SEED)
  with pytest.raises(ValueError, match='bits'):
    tier_codecs.quantize_separate_sign(_delta(), 33, _SEED)


def test_codecs_run_inside_a_tf_function_with_a_tensor_seed():
  x = _delta(6)

  @tf.function
  def encode(delta, seed):
    return (tier_codecs.prune(delta, 0.5, seed),
            tier_codecs.quantize(delta, 4, seed),
            tier_codecs.quantize_separate_sign(delta, 4, seed))

  for graph, eager in zip(
      encode(x, tf.constant(_SEED, tf.int64)),
      (tier_codecs.prune(x, 0.5, _SEED), tier_codecs.quantize(x, 4, _SEED),
       tier_codecs.quantize_separate_sign(x, 4, _SEED))):
    # The same draws; a graph may fuse the arithmetic (float rounding).
    np.testing.assert_allclose(graph.numpy(), eager.numpy(), rtol=1e-6,
                               atol=1e-6)
