"""Recommender models whose parameters are declared global or client-local.

Three architectures cover the PFedRec paper's methods (Sec. 6.2):

- `score_function` (PFedRec): item embedding E + score function S, no user
  embedding; S is one dense layer in the paper's main results (Sec. 6.2),
  `hidden_units` makes it an MLP.
- `matrix_factorization` (FedMF): user embedding p_u, item embedding q_j,
  logit <p_u, q_j>.
- `neural_cf` (FedNCF): user and item embeddings into an MLP.

Parameters live in one `OrderedDict` (fixed order, so TFF types are stable):
`item_embedding` [I, d], `user_embedding` [d] (MF, NCF) and `score_layers`
(a list of `OrderedDict(kernel, bias)`). The item embedding is always global
(aggregated by the server), the user embedding always client-local, and the
score layers are global or client-local: client-local is the first half of
PFedRec's dual personalization (Sec. 4.2). Algorithms read this declaration
from `RecommenderSpec.global_keys` / `local_keys`; `RecommenderModel` exposes
the same split as Keras variables for export.

Initialisation follows the PyTorch defaults of the reference code: embeddings
N(0, 1) (user embeddings with standard deviation 1/d, so that <p_u, q_j>
starts unsaturated),
dense kernels and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)).

Example:
  >>> spec = RecommenderSpec('score_function', num_items=5, embedding_dim=4)
  >>> params = initial_parameters(spec, seed=0)
  >>> logits(spec, params, tf.constant([0, 3])).shape
  TensorShape([2])
"""

import collections
import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_recommenders as tfrs

from tff_fedrec import scoring

ARCHITECTURES = ('score_function', 'matrix_factorization', 'neural_cf')
# NCF's MLP tower on [p_u; q_j] (He et al. 2017 use three hidden layers).
DEFAULT_NCF_HIDDEN_UNITS = (32, 16, 8)

Parameters = collections.OrderedDict


@dataclasses.dataclass(frozen=True)
class RecommenderSpec:
  """What a federated recommender is made of and which parts are shared.

  Attributes:
    architecture: One of `ARCHITECTURES`.
    num_items: Rows of the item embedding table.
    embedding_dim: Width d of user and item embeddings.
    hidden_units: Hidden layer widths of the score function / NCF MLP.
    personal_score_layers: Keep the score layers on the client instead of
      aggregating them (dual personalization, PFedRec Sec. 4.2).
  """

  architecture: str
  num_items: int
  embedding_dim: int
  hidden_units: tuple[int, ...] = ()
  personal_score_layers: bool = True

  def __post_init__(self):
    if self.architecture not in ARCHITECTURES:
      raise ValueError(
          f'Unknown architecture {self.architecture!r}; expected one of '
          f'{ARCHITECTURES}.'
      )
    if self.num_items < 1 or self.embedding_dim < 1:
      raise ValueError('num_items and embedding_dim must be positive.')

  @property
  def has_user_embedding(self) -> bool:
    return self.architecture != 'score_function'

  @property
  def has_score_layers(self) -> bool:
    return self.architecture != 'matrix_factorization'

  @property
  def score_layer_widths(self) -> tuple[tuple[int, int], ...]:
    """(fan_in, fan_out) of each dense layer."""
    if not self.has_score_layers:
      return ()
    fan_in = self.embedding_dim * (2 if self.architecture == 'neural_cf' else 1)
    widths = []
    for units in (*self.hidden_units, 1):
      widths.append((fan_in, units))
      fan_in = units
    return tuple(widths)

  @property
  def keys(self) -> tuple[str, ...]:
    keys = ['item_embedding']
    if self.has_user_embedding:
      keys.append('user_embedding')
    if self.has_score_layers:
      keys.append('score_layers')
    return tuple(keys)

  @property
  def local_keys(self) -> tuple[str, ...]:
    """Parameters that never leave the client."""
    return tuple(
        k
        for k in self.keys
        if k == 'user_embedding'
        or (k == 'score_layers' and self.personal_score_layers)
    )

  @property
  def global_keys(self) -> tuple[str, ...]:
    """Parameters the server aggregates and broadcasts."""
    return tuple(k for k in self.keys if k not in self.local_keys)


def initial_dense_layers(
    rng: np.random.Generator, shapes
) -> list[collections.OrderedDict]:
  """Dense layers `OrderedDict(kernel [fan_in, fan_out], bias [fan_out])`
  for (fan_in, fan_out) in `shapes`, uniform in +-1/sqrt(fan_in) (the
  PyTorch default the reference code uses), float32."""
  layers = []
  for fan_in, fan_out in shapes:
    bound = 1.0 / np.sqrt(fan_in)
    layers.append(
        collections.OrderedDict(
            kernel=rng.uniform(-bound, bound, (fan_in, fan_out)).astype(
                np.float32
            ),
            bias=rng.uniform(-bound, bound, (fan_out,)).astype(np.float32),
        )
    )
  return layers


def initial_parameters(spec: RecommenderSpec, seed: int) -> Parameters:
  """Returns numpy parameters (float32) initialised as described above."""
  rng = np.random.default_rng(seed)
  d = spec.embedding_dim
  params = collections.OrderedDict(
      item_embedding=rng.normal(size=(spec.num_items, d)).astype(np.float32)
  )
  if spec.has_user_embedding:
    params['user_embedding'] = rng.normal(scale=1.0 / d, size=(d,)).astype(
        np.float32
    )
  if spec.has_score_layers:
    layers = initial_dense_layers(rng, spec.score_layer_widths)
    params['score_layers'] = layers
  return params


def split_parameters(
    spec: RecommenderSpec, params: Parameters
) -> tuple[Parameters, Parameters]:
  """Splits `params` into (global, local) `OrderedDict`s by the declaration."""
  global_params = collections.OrderedDict(
      (k, params[k]) for k in spec.global_keys
  )
  local_params = collections.OrderedDict((k, params[k]) for k in spec.local_keys)
  return global_params, local_params


def merge_parameters(
    spec: RecommenderSpec, global_params: Any, local_params: Any
) -> Parameters:
  """Inverse of `split_parameters`, in the canonical key order."""
  merged = {**dict(global_params), **dict(local_params)}
  return collections.OrderedDict((k, merged[k]) for k in spec.keys)


def logits_from_vectors(
    spec: RecommenderSpec, params: Any, item_vectors: tf.Tensor
) -> tf.Tensor:
  """Logits [..., C] for item vectors [..., C, d] (Eq. 6 before the sigmoid).

  `params` may carry a leading user dimension on its local parts.
  """
  layers = [
      (layer['kernel'], layer['bias'])
      for layer in params.get('score_layers', ())
  ]
  if spec.architecture == 'score_function':
    return scoring.score_function_logits(item_vectors, layers)
  if spec.architecture == 'matrix_factorization':
    return scoring.matrix_factorization_logits(
        item_vectors, params['user_embedding']
    )
  return scoring.neural_cf_logits(
      item_vectors, params['user_embedding'], layers
  )


def logits(spec: RecommenderSpec, params: Any, items: tf.Tensor) -> tf.Tensor:
  """Logits [C] of one user's model for item ids [C]."""
  return logits_from_vectors(
      spec, params, tf.gather(params['item_embedding'], items)
  )


class RecommenderModel(tfrs.Model):
  """Keras / TF Recommenders form of one user's model.

  Holds the parameters as `tf.Variable`s and declares which are global and
  which client-local (`global_variables`, `local_variables`). Training runs in
  the algorithms' client work, not in `train_step` (under TFF the training loop
  belongs to the client work); this class is what export and inference use.
  """

  def __init__(self, spec: RecommenderSpec, params: Parameters):
    super().__init__()
    self.spec = spec
    self._params = tf.nest.map_structure(
        lambda value: tf.Variable(value, trainable=True), params
    )
    self.task = tfrs.tasks.Ranking(
        loss=tf.keras.losses.BinaryCrossentropy(from_logits=True)
    )

  @property
  def parameters(self) -> Parameters:
    return self._params

  @property
  def global_variables(self) -> list[tf.Variable]:
    return tf.nest.flatten(
        [self._params[k] for k in self.spec.global_keys]
    )

  @property
  def local_variables(self) -> list[tf.Variable]:
    return tf.nest.flatten([self._params[k] for k in self.spec.local_keys])

  def call(self, items: tf.Tensor) -> tf.Tensor:
    """Logits [C] for item ids [C]."""
    return logits(self.spec, self._params, items)

  def compute_loss(self, features, training: bool = False) -> tf.Tensor:
    """Eq. (7), averaged over the batch: BCE of `features['labels']`."""
    return self.task(
        labels=features['labels'], predictions=self(features['items'])
    )
