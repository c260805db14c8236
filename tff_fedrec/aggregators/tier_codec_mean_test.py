"""The tier-encoded weighted mean against a numpy reference on the same
uniform draws: each user's codec by its tier, the per-element (Channel)
denominator, bytes per tier; and that groups of any size agree."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import tier_codecs
from tff_fedrec.aggregators import tier_codec_mean
from tff_fedrec.programs import execution

UpdateCodec = tier_codecs.UpdateCodec


@pytest.fixture(scope='module', autouse=True)
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


_SHAPES = collections.OrderedDict(table=[6, 3], bias=[4])
_CODECS = (UpdateCodec('quant', 2), UpdateCodec('prune', 0.5),
           UpdateCodec('quants', 3))


def _value_type(structure=_SHAPES):
  return collections.OrderedDict(
      delta=collections.OrderedDict(
          (name, tff.TensorType(np.float32, [None, *shape]))
          for name, shape in structure.items()),
      tier=tff.TensorType(np.int32, [None]),
      seed=tff.TensorType(np.int64, [None, 2]))


def _users(seed, count=5):
  rng = np.random.default_rng(seed)
  deltas = collections.OrderedDict(
      (name, rng.normal(size=[count, *shape]).astype(np.float32))
      for name, shape in _SHAPES.items())
  deltas['table'][:, 2:4] = 0.0  # Rows nobody touched.
  return (deltas, np.array([0, 1, 2, 0, 1], np.int32)[:count],
          rng.integers(0, 2**31, [count, 2]).astype(np.int64),
          rng.integers(1, 20, count).astype(np.float32))


def _draws(seed, index, shape):
  folded = tf.random.experimental.stateless_fold_in(seed, index)
  return tf.random.stateless_uniform(shape, folded).numpy()


def _numpy_encode(kind, value, x, u):
  """The spec's codecs (section 2) in numpy on uniform draws u."""
  if kind == 'prune':
    return np.where(u > value, x, 0.0)
  intervals = 2**value - 1
  if kind == 'quant':
    low, spread = x.min(), x.max() - x.min()
    magnitude, sign = x - low, 1.0
  else:
    low, spread = 0.0, np.abs(x).max()
    magnitude, sign = np.abs(x), np.where(x > 0, 1.0, -1.0)
  if spread == 0:
    return x
  scaled = magnitude / spread * intervals
  level = np.floor(scaled) + (u < scaled - np.floor(scaled))
  return (low + level / intervals * spread) * sign


def _numpy_mean(deltas, tiers, seeds, weights, masks=None):
  sums = {name: 0.0 for name in _SHAPES}
  counts = {name: 0.0 for name in _SHAPES}
  size = np.zeros(3)
  for user in range(tiers.size):
    codec = _CODECS[tiers[user]]
    # A tensor's seed: the user's folded with its index in tf.nest's
    # (name-sorted) order.
    for index, name in enumerate(sorted(_SHAPES)):
      x = deltas[name][user]
      u = _draws(seeds[user], index, x.shape)
      decoded = _numpy_encode(codec.kind, codec.value, x, u)
      m = 1.0 if masks is None else masks[tiers[user]][name]
      sums[name] = sums[name] + weights[user] * m * decoded
      counts[name] = counts[name] + weights[user] * m * np.ones_like(x)
      n = x.size
      size[tiers[user]] += {
          'prune': 4 * np.sum(u > codec.value) + 8,
          'quant': np.ceil(n * codec.value / 8) + 8,
          'quants': np.ceil(n * (codec.value + 1) / 8) + 4,
      }[codec.kind]
  means = {name: np.where(counts[name] > 0,
                          sums[name] / np.maximum(counts[name], 1e-30), 0.0)
           for name in _SHAPES}
  return means, size


def _run(groups, masks=None, codecs=_CODECS):
  process = tier_codec_mean.TierCodecMeanFactory(codecs, masks).create(
      _value_type())
  values = [collections.OrderedDict(
      delta=collections.OrderedDict((k, v[p]) for k, v in deltas.items()),
      tier=tiers[p], seed=seeds[p]) for p, (deltas, tiers, seeds, _) in groups]
  weights = [w[p] for p, (_, _, _, w) in groups]
  return process.next(process.initialize(), values, weights)


def test_each_user_is_encoded_by_its_tier_and_weighted_by_its_samples():
  users = _users(0)
  output = _run([(np.arange(5), users)])
  want, size = _numpy_mean(*users)
  for name in _SHAPES:
    np.testing.assert_allclose(output.result[name], want[name], rtol=1e-5,
                               atol=1e-6)
  np.testing.assert_allclose(output.measurements['bytes_per_tier'], size)
  np.testing.assert_array_equal(output.measurements['users_per_tier'],
                                [2, 2, 1])
  # Encoded, not the plain mean of the deltas.
  plain = np.average(users[0]['table'], axis=0, weights=users[3])
  assert np.abs(output.result['table'] - plain).max() > 1e-2


def test_groups_of_any_size_give_one_result():
  users = _users(1)
  whole = _run([(np.arange(5), users)])
  split = _run([(np.array([0, 3]), users), (np.array([1]), users),
                (np.array([2, 4]), users)])
  for name in _SHAPES:
    np.testing.assert_allclose(split.result[name], whole.result[name],
                               rtol=1e-5, atol=1e-6)


def test_channel_masks_give_a_per_element_mean():
  users = _users(2)
  none = (UpdateCodec(),) * 3
  # Tier t uses the first t + 1 of the 4 bias units, and table rows by tier.
  masks = [collections.OrderedDict(
      table=np.ones([1, 1], np.float32),
      bias=(np.arange(4) <= tier).astype(np.float32)) for tier in range(3)]
  output = _run([(np.arange(5), users)], masks=masks, codecs=none)
  deltas, tiers, _, weights = users
  # Hand-written: unit j's mean over the users whose tier reaches j.
  for unit in range(4):
    using = tiers >= unit
    want = (np.sum(weights[using] * deltas['bias'][using, unit])
            / weights[using].sum()) if using.any() else 0.0
    assert output.result['bias'][unit] == pytest.approx(want, rel=1e-5)
  np.testing.assert_allclose(
      output.result['table'],
      np.average(deltas['table'], axis=0, weights=weights), rtol=1e-5)
  # A tier's message: the 18 table elements and its t + 1 bias units.
  np.testing.assert_allclose(output.measurements['bytes_per_tier'],
                             [2 * 4 * 19, 2 * 4 * 20, 4 * 21])


def test_refuses_values_and_masks_that_do_not_fit():
  with pytest.raises(TypeError, match='delta, tier, seed'):
    tier_codec_mean.TierCodecMeanFactory(_CODECS).create(
        collections.OrderedDict(delta=_value_type()['delta']))
  with pytest.raises(ValueError, match='2 tiers of masks'):
    tier_codec_mean.TierCodecMeanFactory(_CODECS, [{}, {}])
  with pytest.raises(ValueError, match='one or the other'):
    tier_codec_mean.TierCodecMeanFactory(_CODECS, [{}, {}, {}])
