"""DLRM and DIN, the functional form the clients train and the Keras form
phones run (`keras_models`: TFRS blocks, DIN's layers), against numpy
transcriptions of the authors' PyTorch forward passes (DeepCTR-Torch's
DLRM / DIN as RF²'s code runs them), on small random weights where the
plausible wrong variants disagree: the pair order of the interactions,
pooling over padded entries, the masked softmax, Dice's gate, and Channel
as the code's zeroing of outputs."""

import collections
import dataclasses
import math

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec.algorithms.rf2 import keras_models
from tff_fedrec.algorithms.rf2 import models

_SPEC = dict(num_items=7, num_genres=4, embedding_dim=3, hidden_units=5,
             attention_units=(6, 4))


def _random_params(spec, seed):
  """Every parameter random (not the near-zero initialisation), so each
  term of the forward pass shows in the output."""
  rng = np.random.default_rng(seed)
  return tf.nest.map_structure(
      lambda leaf: rng.normal(0.0, 0.7, leaf.shape).astype(np.float32),
      models.initial_parameters(spec, rng))


def _features():
  return collections.OrderedDict(
      item=np.array([0, 3, 6, 2], np.int32),
      genres=np.array([[1, 3, 0], [2, 0, 0], [4, 1, 2], [3, 0, 0]], np.int32),
      history=np.array([[0, 0, 0, 0], [4, 0, 0, 0], [1, 7, 2, 5],
                        [3, 3, 6, 0]], np.int32),
  )


def _numpy_mean_pool(table, ids):
  rows = []
  for row in ids:
    real = [table[i] for i in row if i > 0]
    rows.append(np.sum(real, axis=0) / (len(real) + 1e-8) if real
                else np.zeros(table.shape[1]))
  return np.array(rows)


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _zero_beyond(x, multiplier):
  """The code's Channel: outputs past ceil(width m) zeroed."""
  if multiplier < 1.0:
    x = x.copy()
    x[..., math.ceil(x.shape[-1] * multiplier):] = 0.0
  return x


def _numpy_dlrm(p, f, multiplier=1.0):
  item = p['item_embedding'][f['item']]
  genres = _numpy_mean_pool(p['genre_embedding'], f['genres'])
  history = _numpy_mean_pool(p['history_embedding'], f['history'])
  stacked = np.stack([item, genres, history], axis=1)  # [B, 3, d]
  products = stacked @ stacked.transpose(0, 2, 1)
  # The code's order: li = [i for i in range(3) for j in range(i)].
  pairs = [(i, j) for i in range(3) for j in range(i)]
  z = np.stack([products[:, i, j] for i, j in pairs], axis=1)
  top = p['top_mlp']
  hidden = _zero_beyond(np.maximum(z @ top['hidden_kernel']
                                   + top['hidden_bias'], 0.0), multiplier)
  return (hidden @ top['output_kernel'])[:, 0] + top['output_bias'][0]


def _numpy_dice(x, alpha):
  gate = _sigmoid(x)
  return alpha * (1 - gate) * x + gate * x


def _numpy_din(p, f, multiplier=1.0):
  item = p['item_embedding'][f['item']]
  genres = _numpy_mean_pool(p['genre_embedding'], f['genres'])
  keys = p['history_embedding'][f['history']]  # [B, H, d]
  a = p['attention']
  attended = []
  for b in range(item.shape[0]):
    q = np.repeat(item[b][None], keys.shape[1], axis=0)
    k = keys[b]
    h = np.concatenate([q, k, q - k, q * k], axis=1)
    for layer in range(2):
      h = _zero_beyond(_numpy_dice(h @ a[f'kernel_{layer}']
                                   + a[f'bias_{layer}'],
                                   a[f'dice_{layer}']), multiplier)
    score = (h @ a['output_kernel'])[:, 0] + a['output_bias'][0]
    score = np.where(f['history'][b] > 0, score, -2.0**32 + 1)
    weights = np.exp(score - score.max())
    weights /= weights.sum()
    attended.append(weights @ k)
  x = np.concatenate([item, genres, np.array(attended)], axis=1)
  mlp = p['mlp']
  hidden = _zero_beyond(np.maximum(x @ mlp['hidden_kernel']
                                   + mlp['hidden_bias'], 0.0), multiplier)
  return (hidden @ mlp['output_kernel'])[:, 0] + mlp['output_bias'][0]


_REFERENCES = {'dlrm': _numpy_dlrm, 'din': _numpy_din}


@pytest.mark.parametrize('architecture', models.ARCHITECTURES)
def test_logits_match_the_numpy_transcription_of_the_code(architecture):
  spec = models.ClickModelSpec(architecture, **_SPEC)
  for seed in range(3):
    params = _random_params(spec, seed)
    got = models.logits(spec, params, _features()).numpy()
    np.testing.assert_allclose(
        got, _REFERENCES[architecture](params, _features()), rtol=2e-5,
        atol=2e-5)


@pytest.mark.parametrize('architecture', models.ARCHITECTURES)
@pytest.mark.parametrize('multiplier', [0.25, 0.5, 0.6])
def test_channel_masks_are_the_codes_zeroed_outputs(architecture, multiplier):
  spec = models.ClickModelSpec(architecture, **_SPEC)
  params = _random_params(spec, 4)
  masked = models.apply_masks(params, models.channel_masks(spec, multiplier))
  got = models.logits(spec, masked, _features()).numpy()
  want = _REFERENCES[architecture](params, _features(), multiplier)
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
  # And it is not the unmasked model.
  assert np.abs(want - _REFERENCES[architecture](params, _features())).max(
  ) > 1e-3


def test_channel_masks_keep_ceil_of_each_hidden_width():
  masks = models.channel_masks(models.ClickModelSpec('din', **_SPEC), 0.25)
  # Widths 6, 4 (attention) and 5 (main): ceil(1.5) = 2, 1, ceil(1.25) = 2.
  np.testing.assert_array_equal(masks['attention']['bias_0'],
                                [1, 1, 0, 0, 0, 0])
  np.testing.assert_array_equal(masks['attention']['bias_1'], [1, 0, 0, 0])
  np.testing.assert_array_equal(masks['attention']['kernel_1'][:, 0],
                                [1, 1, 0, 0, 0, 0])
  np.testing.assert_array_equal(masks['mlp']['output_kernel'][:, 0],
                                [1, 1, 0, 0, 0])
  assert masks['attention']['kernel_0'].shape == (12, 6)
  assert np.all(masks['attention']['kernel_0'][:, :2] == 1)  # Inputs kept.
  with pytest.raises(ValueError, match='multiplier'):
    models.channel_masks(models.ClickModelSpec('dlrm', **_SPEC), 0.0)


def test_initial_parameters_follow_the_code():
  spec = models.ClickModelSpec('dlrm', num_items=3000, num_genres=18)
  params = models.initial_parameters(spec, np.random.default_rng(0))
  assert params['item_embedding'].shape == (3000, 16)
  assert params['genre_embedding'].shape == (19, 16)
  assert params['history_embedding'].shape == (3001, 16)
  bound = math.sqrt(1 / 3000)
  table = params['item_embedding']
  assert table.max() <= bound and table.min() >= -bound
  assert table.max() > 0.95 * bound  # Uniform over the whole range.
  hidden = params['top_mlp']['hidden_kernel']
  assert hidden.shape == (3, 256)
  assert 0.5e-4 < hidden.std() < 2e-4
  output = params['top_mlp']['output_kernel']
  assert 1 / 16 * 0.9 < np.abs(output).max() <= 1 / 16  # PyTorch default.
  din = models.initial_parameters(models.ClickModelSpec('din', 3000, 18),
                                  np.random.default_rng(0))
  assert list(din) == ['item_embedding', 'genre_embedding',
                       'history_embedding', 'attention', 'mlp']
  assert din['mlp']['hidden_kernel'].shape == (48, 256)
  assert din['attention']['kernel_0'].shape == (64, 64)
  assert not din['attention']['dice_0'].any()
  assert np.abs(din['mlp']['output_kernel']).max() < 1e-3


def test_embedding_l2_covers_the_whole_tables():
  spec = models.ClickModelSpec('dlrm', **_SPEC)
  params = _random_params(spec, 0)
  want = sum(float(np.sum(params[name] ** 2))
             for name in models.EMBEDDING_TABLES)
  assert float(models.embedding_l2(params)) == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize('architecture', models.ARCHITECTURES)
def test_the_spec_is_read_back_from_the_parameters(architecture):
  spec = models.ClickModelSpec(architecture, **_SPEC)
  if architecture == 'dlrm':  # DLRM has no attention: the default stands.
    spec = dataclasses.replace(
        spec, attention_units=models.ClickModelSpec.attention_units)
  params = models.initial_parameters(spec, np.random.default_rng(0))
  assert models.spec_of(architecture, params) == spec


@pytest.mark.parametrize('architecture', models.ARCHITECTURES)
@pytest.mark.parametrize('multiplier', [1.0, 0.5])
def test_the_keras_model_is_the_codes_model(architecture, multiplier):
  spec = models.ClickModelSpec(architecture, **_SPEC)
  params = _random_params(spec, 7)
  features = _features()
  masked = models.apply_masks(params, models.channel_masks(spec, multiplier))
  model = keras_models.from_parameters(spec, masked)
  got = model(features).numpy()
  np.testing.assert_allclose(
      got, _REFERENCES[architecture](params, features,
                                                  multiplier),
      rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(got, models.logits(spec, masked,
                                                features).numpy(),
                             rtol=1e-6, atol=1e-6)


def test_dice_is_the_gated_mix_of_x_and_alpha_x():
  layer = keras_models.Dice()
  x = np.array([[-2.0, 0.0, 3.0]], np.float32)
  layer.build(x.shape)
  layer.set_weights([np.array([0.5, 0.5, -1.0], np.float32)])
  gate = 1 / (1 + np.exp(-x))
  want = np.array([0.5, 0.5, -1.0]) * (1 - gate) * x + gate * x
  np.testing.assert_allclose(layer(x).numpy(), want, rtol=1e-6)
  # alpha = 0 (the initialisation) is x * sigmoid(x).
  np.testing.assert_allclose(keras_models.Dice()(x).numpy(), x * gate,
                             rtol=1e-6)
