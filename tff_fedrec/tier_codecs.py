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
`UpdateCodec` is one tier's choice of these, and the bytes of its
message; `encode_users` encodes a group of users' updates, each by its
tier's codec, inside any client computation (every method's uploads, and
RF²'s aggregation).
"""

import dataclasses
from collections.abc import Sequence

import tensorflow as tf

UNTOUCHED_BITS = 32
_MESSAGE_SEED_TAG = 1 << 29


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


CODEC_KINDS = ('none', 'prune', 'quant', 'quants')


@dataclasses.dataclass(frozen=True)
class UpdateCodec:
  """One tier's encoding of every tensor of an update, and the size of its
  message.

  Attributes:
    kind: 'none', 'prune' (`value` the rate), 'quant' or 'quants' (`value`
      the bits; 32 leaves the tensor as it is).
    value: The rate or the bits.

  Message bytes per tensor of n elements: 'none' 4n; 'prune' 4 per kept
  element plus the 8-byte seed that regenerates the mask; 'quant'
  ceil(n bits / 8) plus min and max (8); 'quants' ceil(n (bits + 1) / 8)
  plus max |x| (4); untouched tiers (rate 0, 32 bits) 4n.
  """

  kind: str = 'none'
  value: float = 0.0

  def __post_init__(self):
    if self.kind not in CODEC_KINDS:
      raise ValueError(f'kind must be one of {CODEC_KINDS}; got '
                       f'{self.kind!r}.')
    if self.kind == 'prune' and not 0.0 <= self.value < 1.0:
      raise ValueError(f'A prune rate must be in [0, 1); got {self.value}.')
    if self.kind in ('quant', 'quants') and (
        self.value != int(self.value)
        or not 1 <= self.value <= UNTOUCHED_BITS):
      raise ValueError(f'Bits must be an integer in [1, {UNTOUCHED_BITS}]; '
                       f'got {self.value}.')

  @property
  def untouched(self) -> bool:
    return (self.kind == 'none' or (self.kind == 'prune' and self.value == 0)
            or (self.kind != 'prune' and self.value == UNTOUCHED_BITS))

  def encode(self, delta: tf.Tensor, seed) -> tf.Tensor:
    """The decoded message of one tensor: what the server receives."""
    if self.untouched:
      return delta
    if self.kind == 'prune':
      return prune(delta, self.value, seed)
    return _quantized(delta, int(self.value), seed,
                      separate_sign=self.kind == 'quants')

  def message_bytes(self, delta: tf.Tensor, seed) -> tf.Tensor:
    """float32: the bytes of one tensor's message (class docstring)."""
    n = tf.cast(tf.size(delta), tf.float32)
    if self.untouched:
      return 4.0 * n
    if self.kind == 'prune':
      kept = tf.reduce_sum(tf.cast(_uniform(delta, seed) > self.value,
                                   tf.float32))
      return 4.0 * kept + 8.0
    if self.kind == 'quant':
      return tf.math.ceil(n * self.value / 8.0) + 8.0
    return tf.math.ceil(n * (self.value + 1.0) / 8.0) + 4.0


def encode_message(codecs: Sequence[UpdateCodec], deltas, tier, seed):
  """(decoded tensors, message bytes float32) of one user's update, a
  nest of tensors, under its tier's codec (`tier`: int32 scalar, an
  index into `codecs`). Each tensor's seed is `seed` folded with its index
  in `tf.nest.flatten`'s order."""
  flat = tf.nest.flatten(deltas)

  def branch(codec):
    def encode():
      seeds = [tf.random.experimental.stateless_fold_in(seed, index)
               for index in range(len(flat))]
      decoded = [codec.encode(d, s) for d, s in zip(flat, seeds)]
      size = tf.add_n([codec.message_bytes(d, s)
                       for d, s in zip(flat, seeds)])
      return decoded, size
    return encode

  if len(codecs) == 1:
    decoded, size = branch(codecs[0])()
  else:
    decoded, size = tf.switch_case(tier, [branch(c) for c in codecs])
  return tf.nest.pack_sequence_as(deltas, decoded), size


def encode_users(codecs: Sequence[UpdateCodec], deltas, tiers, seeds,
                 row_counts=None):
  """`encode_message` of each of U users: `deltas` a nest of float32
  [U, ...], `tiers` int32 [U], `seeds` int [U, 2]; returns (the decoded
  nest [U, ...], message bytes float32 [U]).

  `row_counts`: for a `deltas` mapping, {key: int32 [U]}: that key's
  tensor of user u holds row_counts[key][u] real rows, then padding;
  only the real rows are its message (encoded, counted), the padding
  comes back as zeros. None: every element is sent."""
  row_counts = dict(row_counts or {})
  keys = list(row_counts)
  counts = [row_counts[key] for key in keys]
  flat = [tf.convert_to_tensor(d, tf.float32) for d in tf.nest.flatten(deltas)]

  def one_user(inputs):
    user_deltas, user_counts, tier, seed = inputs
    message = tf.nest.pack_sequence_as(deltas, user_deltas)
    padded = {}
    for key, count in zip(keys, user_counts):
      padded[key] = tf.shape(message[key])[0]
      message[key] = message[key][:count]
    decoded, size = encode_message(codecs, message, tier, seed)
    for key, count in zip(keys, user_counts):
      rank = len(message[key].shape)
      decoded[key] = tf.pad(decoded[key], [[0, padded[key] - count]]
                            + [[0, 0]] * (rank - 1))
    return tf.nest.flatten(decoded), size

  decoded, sizes = tf.map_fn(
      one_user, (flat, counts, tiers, seeds),
      fn_output_signature=(
          [tf.TensorSpec(d.shape[1:], tf.float32) for d in flat],
          tf.TensorSpec([], tf.float32)))
  return tf.nest.pack_sequence_as(deltas, decoded), sizes


def message_seeds(seeds):
  """int64 [U, 2]: the seeds of U users' messages' codecs, from the users'
  data seeds (int [U, 2]) folded with a tag, so a codec's draws never
  share a seed with the same user's other uses of it (a reshuffle, LDP
  noise)."""
  return tf.map_fn(
      lambda seed: tf.cast(
          tf.random.experimental.stateless_fold_in(seed, _MESSAGE_SEED_TAG),
          tf.int64),
      seeds, fn_output_signature=tf.TensorSpec([2], tf.int64))
