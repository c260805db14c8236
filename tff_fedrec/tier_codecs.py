"""RF²'s lossy encodings of a client's model update (Maeng et al., RecSys
'22, Sec. 5.2; the authors' code as `../shared/specs/rf2.md` section 2
reads it), applied per tensor to the whole update delta = w_old - w_new,
embedding tables included. Plain TF, so they run inside a client
computation (the bytes counted are then the bytes that would cross).

- `prune(delta, rate, seed)`: keeps each element with probability
  1 - rate (`U(0, 1) > rate`), zeroes the rest, with no 1 / (1 - rate)
  rescaling (the code's choice: a pruned update shrinks).
- `quantize(delta, bits, seed)`: stochastic rounding on 2^bits - 1
  intervals between the tensor's min and max: x' = (x - min) / (max - min)
  (2^bits - 1); floor, then one up with probability equal to the fraction
  (unbiased: the code's direction; the paper's text has it the other way,
  which is biased); back to the range. A tensor with min == max is left as
  it is. Zero is generally not on the grid.
- `quantize_separate_sign(delta, bits, seed)` (QuantS): the same on
  |x| in [0, max |x|], then times the sign (+1 for x > 0, else -1): bits
  for the magnitude plus a sign bit (the code; the paper says bits - 1 for
  the magnitude). Exact zeros stay exactly zero, the rows a client never
  touched included.

A rate of 0 and 32 bits (`UNTOUCHED_BITS`) leave the delta as it is.
`seed` is a stateless seed, int [2] (`tf.random.stateless_uniform`).
"""

import tensorflow as tf

UNTOUCHED_BITS = 32


def _uniform(delta: tf.Tensor, seed) -> tf.Tensor:
  return tf.random.stateless_uniform(tf.shape(delta), seed, dtype=tf.float32)


def prune(delta: tf.Tensor, rate: float, seed) -> tf.Tensor:
  """`delta` with each element zeroed with probability `rate`."""
  if not 0.0 <= rate < 1.0:
    raise ValueError(f'rate must be in [0, 1); got {rate}.')
  if rate == 0.0:
    return delta
  keep = _uniform(delta, seed) > rate
  return tf.where(keep, delta, tf.zeros_like(delta))


def _stochastic_round(scaled: tf.Tensor, seed) -> tf.Tensor:
  """floor(x) + 1 with probability frac(x): E = x."""
  low = tf.floor(scaled)
  up = tf.cast(_uniform(scaled, seed) < scaled - low, scaled.dtype)
  return low + up


def _on_grid(values, low, spread, bits: int, seed):
  """`values` rounded stochastically onto 2^bits - 1 intervals of
  [low, low + spread], and whether the range is not empty."""
  intervals = float(2**bits - 1)
  safe = tf.where(spread > 0, spread, 1.0)
  levels = _stochastic_round((values - low) / safe * intervals, seed)
  return low + levels / intervals * safe, spread > 0


def _quantized(delta, bits: int, seed, separate_sign: bool):
  if not 1 <= bits <= UNTOUCHED_BITS:
    raise ValueError(f'bits must be in [1, {UNTOUCHED_BITS}]; got {bits}.')
  if bits == UNTOUCHED_BITS:
    return delta
  delta = tf.convert_to_tensor(delta, tf.float32)
  if separate_sign:
    magnitude = tf.abs(delta)
    decoded, ranged = _on_grid(magnitude, 0.0, tf.reduce_max(magnitude),
                               bits, seed)
    decoded *= tf.where(delta > 0, 1.0, -1.0)
  else:
    low = tf.reduce_min(delta)
    decoded, ranged = _on_grid(delta, low, tf.reduce_max(delta) - low, bits,
                               seed)
  return tf.where(ranged, decoded, delta)


def quantize(delta: tf.Tensor, bits: int, seed) -> tf.Tensor:
  """Quant of the module docstring."""
  return _quantized(delta, bits, seed, separate_sign=False)


def quantize_separate_sign(delta: tf.Tensor, bits: int, seed) -> tf.Tensor:
  """QuantS of the module docstring."""
  return _quantized(delta, bits, seed, separate_sign=True)
