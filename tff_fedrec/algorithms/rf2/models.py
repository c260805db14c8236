"""RF²'s click-through models, DLRM and DIN, as functions of their
parameters (Maeng et al., RecSys '22, Sec. 5.1; the authors' DeepCTR-Torch
models as `../shared/specs/rf2.md` section 4 reads them).

An event's features (`tasks.click_through`): the movie `item` (int [...]),
its `genres` (int [..., G], genre + 1, 0 pads) and the user's last clicked
movies `history` (int [..., H], movie + 1, 0 pads, oldest first). Each has
its own table of dimension d = 16: item_embedding [I, d],
genre_embedding [G + 1, d], history_embedding [I + 1, d] (row 0 pads).

- DLRM: the movie's row, the mean of its genres' rows and the mean of the
  history's rows (mean over the real entries, / (n + 1e-8) as the code's
  sequence pooling, so an empty history pools to 0); their pairwise dot
  products (i > j, TF Recommenders' `DotInteraction`, the code's order);
  top MLP 3 -> 256 (ReLU) -> 1 (+ a scalar bias).
- DIN (Zhou et al., KDD 2018): attention over the history keyed by the
  movie: the local activation unit on [q, k, q - k, q * k] (4d) -> 64 ->
  16 with Dice (no normalisation: Dice(x) = alpha (1 - sigmoid(x)) x +
  sigmoid(x) x, alpha per unit, starting at 0) -> 1; the scores of padded
  entries set to -2^32 + 1 and softmax-normalised (an empty history then
  weighs its padded rows uniformly, as the code does); the weighted sum of
  the history rows; then [movie, mean genres, attended history] (3d) ->
  256 (ReLU) -> 1 (+ bias).

Initialisation as the code: tables U(+-sqrt(1 / rows)); MLP kernels
N(0, 1e-4^2), biases and Dice's alpha 0; DLRM's output kernel PyTorch's
default Linear init U(+-1 / sqrt(256)).

Channel (the code's HeteroFL option, `channel_masks`): a tier with
multiplier m keeps the first ceil(width m) units of every hidden layer
(DLRM's top MLP; DIN's main and attention MLPs), the inputs always. As
ReLU(0) = Dice(0) = 0, zeroing a dropped unit's incoming kernel column and
bias, and its outgoing kernel row, is the code's zeroing of its outputs;
the masks also say which elements a tier's update holds (the per-element
mean of the aggregation).

Parameters are an `OrderedDict` (numpy or TF) with the keys of
`initial_parameters`; everything is global (RF²'s clients keep nothing).
"""

import collections
import dataclasses
import math

import numpy as np
import tensorflow as tf
import tensorflow_recommenders as tfrs

ARCHITECTURES = ('dlrm', 'din')
EMBEDDING_TABLES = ('item_embedding', 'genre_embedding', 'history_embedding')
MASKED_SCORE = -2.0**32 + 1
POOLING_EPSILON = 1e-8
_MLP_INIT_STDDEV = 1e-4


@dataclasses.dataclass(frozen=True)
class ClickModelSpec:
  """A model's sizes.

  Attributes:
    architecture: 'dlrm' or 'din'.
    num_items: I.
    num_genres: G (genre ids 1..G; 0 pads).
    embedding_dim: d.
    hidden_units: The top (DLRM) or main (DIN) MLP's hidden width.
    attention_units: DIN's local activation unit's hidden widths.
  """

  architecture: str
  num_items: int
  num_genres: int
  embedding_dim: int = 16
  hidden_units: int = 256
  attention_units: tuple[int, ...] = (64, 16)

  def __post_init__(self):
    if self.architecture not in ARCHITECTURES:
      raise ValueError(f'architecture must be one of {ARCHITECTURES}; got '
                       f'{self.architecture!r}.')

  @property
  def mlp_input_width(self) -> int:
    """DLRM: the 3 pairwise products; DIN: 3 concatenated vectors."""
    return 3 if self.architecture == 'dlrm' else 3 * self.embedding_dim


def spec_of(architecture: str, params) -> ClickModelSpec:
  """The spec of a model's parameters (`initial_parameters`' nest)."""
  items, d = params['item_embedding'].shape
  top = params['top_mlp' if architecture == 'dlrm' else 'mlp']
  attention = params.get('attention', {})
  return ClickModelSpec(
      architecture, num_items=int(items),
      num_genres=int(params['genre_embedding'].shape[0]) - 1,
      embedding_dim=int(d), hidden_units=int(top['hidden_bias'].shape[0]),
      attention_units=tuple(int(attention[k].shape[0])
                            for k in attention if k.startswith('bias_'))
      or ClickModelSpec.attention_units)


def _table(rng, rows, dim):
  bound = math.sqrt(1.0 / rows)
  return rng.uniform(-bound, bound, [rows, dim]).astype(np.float32)


def _kernel(rng, rows, columns):
  return rng.normal(0.0, _MLP_INIT_STDDEV, [rows, columns]).astype(np.float32)


def _mlp(rng, input_width, hidden, output_kernel):
  return collections.OrderedDict(
      hidden_kernel=_kernel(rng, input_width, hidden),
      hidden_bias=np.zeros([hidden], np.float32),
      output_kernel=output_kernel,
      output_bias=np.zeros([1], np.float32),
  )


def initial_parameters(spec: ClickModelSpec,
                       rng: np.random.Generator) -> collections.OrderedDict:
  """The parameters at initialisation (module docstring), float32."""
  d, hidden = spec.embedding_dim, spec.hidden_units
  params = collections.OrderedDict(
      item_embedding=_table(rng, spec.num_items, d),
      genre_embedding=_table(rng, spec.num_genres + 1, d),
      history_embedding=_table(rng, spec.num_items + 1, d),
  )
  if spec.architecture == 'dlrm':
    bound = 1.0 / math.sqrt(hidden)
    params['top_mlp'] = _mlp(rng, spec.mlp_input_width, hidden, rng.uniform(
        -bound, bound, [hidden, 1]).astype(np.float32))
    return params
  attention = collections.OrderedDict()
  width = 4 * d
  for layer, units in enumerate(spec.attention_units):
    attention[f'kernel_{layer}'] = _kernel(rng, width, units)
    attention[f'bias_{layer}'] = np.zeros([units], np.float32)
    attention[f'dice_{layer}'] = np.zeros([units], np.float32)
    width = units
  attention['output_kernel'] = _kernel(rng, width, 1)
  attention['output_bias'] = np.zeros([1], np.float32)
  params['attention'] = attention
  params['mlp'] = _mlp(rng, spec.mlp_input_width, hidden,
                       _kernel(rng, hidden, 1))
  return params


def dice(x, alpha):
  """Dice without normalisation (DIN Eq. 9 as the code runs it):
  alpha (1 - sigmoid(x)) x + sigmoid(x) x."""
  gate = tf.sigmoid(x)
  return alpha * (1.0 - gate) * x + gate * x


def mean_pool(table, ids):
  """Mean of table[ids] over the nonzero ids (sum / (n + 1e-8)): [..., d]."""
  valid = tf.cast(ids > 0, table.dtype)[..., None]
  total = tf.reduce_sum(tf.gather(table, ids) * valid, axis=-2)
  return total / (tf.reduce_sum(valid, axis=-2) + POOLING_EPSILON)


def local_activation_input(query, keys):
  """DIN's local activation unit's input [B, H, 4d]: [q, k, q - k, q * k]
  of query [B, d] against each of keys [B, H, d]."""
  query = tf.broadcast_to(query[:, None, :], tf.shape(keys))
  return tf.concat([query, keys, query - keys, query * keys], axis=-1)


def attention_pool(scores, keys, valid):
  """sum_h softmax(scores, padded entries at -2^32 + 1)_h keys_h: scores
  [B, H], keys [B, H, d], valid bool [B, H] -> [B, d]."""
  weights = tf.nn.softmax(tf.where(valid, scores, MASKED_SCORE), axis=-1)
  return tf.reduce_sum(weights[..., None] * keys, axis=-2)


def _attend(attention, query, keys, valid, layers: int):
  """DIN's attention pooling: query [B, d], keys [B, H, d], valid bool
  [B, H] -> [B, d]."""
  hidden = local_activation_input(query, keys)
  for layer in range(layers):
    hidden = dice(
        tf.matmul(hidden, attention[f'kernel_{layer}'])
        + attention[f'bias_{layer}'], attention[f'dice_{layer}'])
  scores = (tf.matmul(hidden, attention['output_kernel'])[..., 0]
            + attention['output_bias'][0])
  return attention_pool(scores, keys, valid)


def _top(mlp, inputs):
  hidden = tf.nn.relu(tf.matmul(inputs, mlp['hidden_kernel'])
                      + mlp['hidden_bias'])
  return tf.matmul(hidden, mlp['output_kernel'])[:, 0] + mlp['output_bias'][0]


def logits(spec: ClickModelSpec, params, features) -> tf.Tensor:
  """float32 [B]: the click logits of a batch of events (`features`:
  item [B], genres [B, G], history [B, H])."""
  item = tf.gather(params['item_embedding'], features['item'])
  genres = mean_pool(params['genre_embedding'], features['genres'])
  history_ids = features['history']
  if spec.architecture == 'dlrm':
    history = mean_pool(params['history_embedding'], history_ids)
    interactions = tfrs.layers.feature_interaction.DotInteraction(
        self_interaction=False)([item, genres, history])
    return _top(params['top_mlp'], interactions)
  history = _attend(params['attention'], item,
                    tf.gather(params['history_embedding'], history_ids),
                    history_ids > 0, len(spec.attention_units))
  return _top(params['mlp'], tf.concat([item, genres, history], axis=-1))


def embedding_l2(params) -> tf.Tensor:
  """sum of w^2 over the whole embedding tables (the code's
  --l2-reg-emb term, before its factor)."""
  return tf.add_n([tf.reduce_sum(tf.square(params[name]))
                   for name in EMBEDDING_TABLES])


def kept_units(width: int, multiplier: float) -> int:
  """ceil(width m): the units a Channel tier keeps (the code's rounding)."""
  if not 0.0 < multiplier <= 1.0:
    raise ValueError(f'A channel multiplier must be in (0, 1]; got '
                     f'{multiplier}.')
  return math.ceil(width * multiplier)


def _unit_mask(width, kept):
  return (np.arange(width) < kept).astype(np.float32)


def _mlp_masks(mlp_shapes, hidden_kept):
  hidden = _unit_mask(mlp_shapes['hidden_bias'][0], hidden_kept)
  return collections.OrderedDict(
      hidden_kernel=np.broadcast_to(hidden[None], mlp_shapes['hidden_kernel']),
      hidden_bias=hidden,
      output_kernel=np.broadcast_to(hidden[:, None],
                                    mlp_shapes['output_kernel']),
      output_bias=np.ones([1], np.float32),
  )


def channel_masks(spec: ClickModelSpec,
                  multiplier: float) -> collections.OrderedDict:
  """0/1 float32 masks in the nest of the parameters, each broadcastable
  to its parameter: 1 where a tier of channel `multiplier` uses the
  element (module docstring). The tables are never masked ([1, 1])."""
  shapes = tf.nest.map_structure(
      lambda leaf: leaf.shape,
      initial_parameters(spec, np.random.default_rng(0)))
  masks = collections.OrderedDict(
      (name, np.ones([1, 1], np.float32)) for name in EMBEDDING_TABLES)
  top = 'top_mlp' if spec.architecture == 'dlrm' else 'mlp'
  masks[top] = _mlp_masks(shapes[top],
                          kept_units(spec.hidden_units, multiplier))
  if spec.architecture == 'din':
    attention = collections.OrderedDict()
    previous = np.ones([4 * spec.embedding_dim], np.float32)
    for layer, units in enumerate(spec.attention_units):
      unit = _unit_mask(units, kept_units(units, multiplier))
      attention[f'kernel_{layer}'] = previous[:, None] * unit[None]
      attention[f'bias_{layer}'] = unit
      attention[f'dice_{layer}'] = unit
      previous = unit
    attention['output_kernel'] = previous[:, None]
    attention['output_bias'] = np.ones([1], np.float32)
    masks['attention'] = attention
    masks.move_to_end(top)
  return masks


def apply_masks(params, masks):
  """The parameters with the masked elements zeroed."""
  return tf.nest.map_structure(lambda p, m: p * m, params, masks)
