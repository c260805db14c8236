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
    split_first_layer: 'neural_cf' only: compute the MLP's first layer as
      a user part plus an item part (HeteFedRec's tiers and its
      centralised reference, `scoring.neural_cf_logits`).
  """

  architecture: str
  num_items: int
  embedding_dim: int
  hidden_units: tuple[int, ...] = ()
  personal_score_layers: bool = True
  split_first_layer: bool = False

  def __post_init__(self):
    if self.architecture not in ARCHITECTURES:
      raise ValueError(
          f'Unknown architecture {self.architecture!r}; expected one of '
          f'{ARCHITECTURES}.'
      )
    if self.num_items < 1 or self.embedding_dim < 1:
      raise ValueError('num_items and embedding_dim must be positive.')
    if self.split_first_layer and self.architecture != 'neural_cf':
      raise ValueError('split_first_layer applies to neural_cf only.')

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
      for layer in (params['score_layers'] if spec.has_score_layers else ())
  ]
  if spec.architecture == 'score_function':
    return scoring.score_function_logits(item_vectors, layers)
  if spec.architecture == 'matrix_factorization':
    return scoring.matrix_factorization_logits(
        item_vectors, params['user_embedding']
    )
  return scoring.neural_cf_logits(
      item_vectors, params['user_embedding'], layers,
      split_first_layer=spec.split_first_layer,
  )


def logits(spec: RecommenderSpec, params: Any, items: tf.Tensor) -> tf.Tensor:
  """Logits [C] of one user's model for item ids [C]."""
  return logits_from_vectors(
      spec, params, tf.gather(params['item_embedding'], items)
  )


USER_EMBEDDINGS = ('own', 'input', 'table')


class RecommenderModel(tfrs.Model):
  """The Keras / TF Recommenders form of an architecture's model: what a
  phone runs (`export.on_device_model` builds its signatures from it) and
  what centralised training trains (`programs.centralized_training`).

  Holds the parameters as `tf.Variable`s and declares which are global and
  which client-local (`global_variables`, `local_variables`), as
  `RecommenderSpec` declares them. Its math is `logits_from_vectors`, the
  function the clients train with, so training and the phone cannot
  drift. Federated training itself runs in the algorithms' client work,
  not in `train_step` (under TFF the loop belongs to the client work).

  The user part, for architectures that have one (`user_embedding`):
    'own'    one user's embedding [d], a variable (a user's own model);
    'input'  none: the user vector [d] comes with every call (a tier's
             global model, whose user part stays on the phone);
    'table'  a table [U, d] of every user's embedding, read at
             `user_ids` (centralised training).

  Example:
    >>> model = RecommenderModel(spec, params)  # a user's own model
    >>> model.score(tf.constant([3, 1]))        # logits [2]
    >>> model.top_k(tf.constant([1]), k=2)      # (ids [2], scores [2])
  """

  def __init__(self, spec: RecommenderSpec, params: Parameters, *,
               user_embedding: str = 'own'):
    """`params` as `initial_parameters` returns them (numpy); with
    `user_embedding='table'` its `user_embedding` is [U, d]; with 'input'
    it has none."""
    super().__init__()
    if user_embedding not in USER_EMBEDDINGS:
      raise ValueError(f'user_embedding must be one of {USER_EMBEDDINGS}; '
                       f'got {user_embedding!r}.')
    if not spec.has_user_embedding and user_embedding != 'own':
      raise ValueError(f'{spec.architecture} has no user embedding.')
    self.spec = spec
    self.user_embedding = user_embedding
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
  def takes_user_embedding(self) -> bool:
    return self.spec.has_user_embedding and self.user_embedding == 'input'

  def _keys(self, keys) -> list[tf.Variable]:
    return tf.nest.flatten([self._params[k] for k in keys if k in self._params])

  @property
  def global_variables(self) -> list[tf.Variable]:
    return self._keys(self.spec.global_keys)

  @property
  def local_variables(self) -> list[tf.Variable]:
    return self._keys(self.spec.local_keys)

  def logits_of_vectors(self, item_vectors, user_vector=None) -> tf.Tensor:
    """Logits [..., C] of item vectors [..., C, d] for the user vector
    [..., d] (the model's own, or the one given with 'input' / 'table')."""
    params = dict(self._params)
    if user_vector is not None:
      params['user_embedding'] = user_vector
    return logits_from_vectors(self.spec, params, item_vectors)

  def score(self, item_ids, user_vector=None) -> tf.Tensor:
    """Logits [C] of items [C] (`user_vector` [d] with 'input')."""
    return self.logits_of_vectors(
        tf.gather(self._params['item_embedding'], item_ids), user_vector)

  def top_k(self, exclude_ids, k: int, user_vector=None):
    """(item ids [K], logits [K]): the K best items of all I, best first
    (equal scores: lower id first, `tf.math.top_k`), never one of
    `exclude_ids` [E]; fewer when fewer are left.

    It takes the best K + E and drops the excluded ones instead of masking
    their scores with -inf: an infinite value gives the scores an infinite
    quantization range, on which TF 2.14's full-integer TFLite converter
    fails. `tfrs.layers.factorized_top_k` does not serve here: it retrieves
    by the dot product of a query and candidate embeddings, which the MLP
    scorers of PFedRec and NCF are not.
    """
    table = self._params['item_embedding']
    num_items = self.spec.num_items
    scores = self.logits_of_vectors(table, user_vector)
    # At most E of the best K + E items are excluded, so K others remain.
    candidates = tf.minimum(k + tf.size(exclude_ids), num_items)
    best_scores, best_ids = tf.math.top_k(scores, candidates)
    times_excluded = tf.scatter_nd(
        exclude_ids[:, None], tf.ones_like(exclude_ids), [num_items]
    )
    kept = tf.equal(tf.gather(times_excluded, best_ids), 0)
    return (tf.boolean_mask(best_ids, kept)[:k],
            tf.boolean_mask(best_scores, kept)[:k])

  def call(self, features) -> tf.Tensor:
    """Logits [B] of `features['item_ids']` [B], for the model's own user,
    `features['user_embedding']` [B, d] ('input') or the users
    `features['user_ids']` [B] ('table')."""
    vectors = tf.gather(self._params['item_embedding'], features['item_ids'])
    if self.user_embedding == 'own':
      return self.logits_of_vectors(vectors)
    if self.user_embedding == 'input':
      user_vector = features['user_embedding']
    else:
      user_vector = tf.gather(self._params['user_embedding'],
                              features['user_ids'])
    # Each example is one user's one candidate.
    return self.logits_of_vectors(vectors[:, None, :], user_vector)[:, 0]

  def score_users(self, user_ids) -> tf.Tensor:
    """'table': every item's logits [U, I] for the users `user_ids` [U],
    the item vectors shared [1, I, d], never copied per user (matrix
    factorisation, or NCF with `split_first_layer`)."""
    return self.logits_of_vectors(
        self._params['item_embedding'][None],
        tf.gather(self._params['user_embedding'], user_ids))

  def compute_loss(self, features, training: bool = False) -> tf.Tensor:
    """Eq. (7), averaged over the batch: the `Ranking` task's binary
    cross-entropy of `features['labels']` [B] against `call`'s logits."""
    return self.task(labels=features['labels'], predictions=self(features))
