"""One user's recommender as a `tf.Module` with the serving signatures a phone
app calls, built from the architecture's TF Recommenders model.

The module's signatures are those of a `tff_fedrec.models.RecommenderModel`
(the Keras / `tfrs.Model` form of the architecture), whose math is
`tff_fedrec.models.logits_from_vectors`, the function the clients train with
(PFedRec Eq. 6 before the sigmoid for 'score_function', FedMF's <p_u, q_j>
for 'matrix_factorization', the NCF MLP on [p_u ; q_j] for 'neural_cf'). Which
method maps to which architecture:

- PFedRec: 'score_function' with the user's personal score layers and
  personal item table, no user vector.
- FedMF: 'matrix_factorization', no score layers.
- FedNCF and HeteFedRec's tier models: 'neural_cf' on [u ; v] (the tiers'
  with the first layer split, as HeteFedRec trains them). For Fed-LightGCN
  the caller passes the propagated user vector u'
  (`hetefedrec.models.user_representation`), not u.

When the architecture needs a user vector and none is baked in (a HeteFedRec
tier's global model, whose user embeddings stay private on the phones), both
signatures take it as the extra input `user_embedding` float32 [d].

Signatures (inputs -> outputs):

- `score`: `item_ids` int32 [C] (-> `scores` float32 [C]): logits of the given
  items.
- `top_k`: `exclude_ids` int32 [E] (-> `item_ids` int32 [K], `scores` float32
  [K]): the K best items over all I items, best first, never one of
  `exclude_ids` (the items the user has already seen; E may be 0). K is
  fixed at construction (`min(top_k, I)`); when fewer than K items are left
  after the exclusion, both outputs are shorter.

Item ids must lie in [0, I); TF and the TFLite interpreter (the bounds
checks of GATHER and SCATTER_ND) raise on others.

`top_k` is `RecommenderModel.top_k`: the best K + E items with the excluded
ones dropped, never -inf scores (TF 2.14's full-integer converter fails on
an infinite quantization range: 'illegal scale: INF', then a segmentation
fault). Equal scores come out lower id first (`tf.math.top_k`).

Parameters are the model's `tf.Variable`s, which the TFLite converter freezes
into the model. With a baked-in user vector every score of `top_k` is a function of
constants only, so the converter folds them into one constant [I] and the
on-device `top_k` reduces to the top-K search.

Example:
  >>> module = OnDeviceRecommender(
  ...     'matrix_factorization',
  ...     item_embedding=np.eye(3, dtype=np.float32),
  ...     user_embedding=np.array([0.0, 2.0, 1.0], np.float32),
  ...     top_k=2,
  ... )
  >>> module.top_k(tf.constant([1]))['item_ids'].numpy()
  array([2, 0], dtype=int32)
"""

import collections
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tff_fedrec import models

SCORE_SIGNATURE = 'score'
TOP_K_SIGNATURE = 'top_k'
DEFAULT_TOP_K = 10

DenseLayer = tuple[np.ndarray, np.ndarray]


def _float32_array(value, name: str, ndim: int) -> np.ndarray:
  array = np.asarray(value, dtype=np.float32)
  if array.ndim != ndim:
    raise ValueError(f'{name} must have {ndim} dimensions; got {array.shape}.')
  return array


def _checked_spec(
    architecture: str,
    item_embedding: np.ndarray,
    score_layers: Sequence[DenseLayer],
    split_first_layer: bool = False,
) -> models.RecommenderSpec:
  """The `RecommenderSpec` the arrays describe; raises if their shapes do not
  chain into that architecture's score layers."""
  num_items, dim = item_embedding.shape
  hidden = tuple(np.shape(kernel)[-1] for kernel, _ in score_layers[:-1])
  spec = models.RecommenderSpec(architecture, num_items, dim, hidden,
                                split_first_layer=split_first_layer)
  shapes = tuple(
      (np.shape(kernel), np.shape(bias)) for kernel, bias in score_layers
  )
  expected = tuple(
      ((fan_in, fan_out), (fan_out,))
      for fan_in, fan_out in spec.score_layer_widths
  )
  if shapes != expected:
    raise ValueError(
        f'{architecture} with item embedding [{num_items}, {dim}] needs '
        f'(kernel, bias) shapes like {expected or "()"}; got {shapes}.'
    )
  return spec


class OnDeviceRecommender(tf.Module):
  """The `score` and `top_k` signatures of one recommender (module docstring).

  Attributes:
    model: Its `models.RecommenderModel`.
    score: `tf.function`, `score(item_ids[, user_embedding])` returns
      `{'scores': [C]}`.
    top_k: `tf.function`, `top_k(exclude_ids[, user_embedding])` returns
      `{'item_ids': [K], 'scores': [K]}`.
    k: K, the number of items `top_k` returns.
    takes_user_embedding: Whether both signatures take `user_embedding`.
  """

  def __init__(
      self,
      architecture: str,
      item_embedding: np.ndarray,
      score_layers: Sequence[DenseLayer] = (),
      user_embedding: np.ndarray | None = None,
      *,
      split_first_layer: bool = False,
      top_k: int = DEFAULT_TOP_K,
      name: str | None = None,
  ):
    """Builds the module from numpy parameters.

    Args:
      architecture: One of `tff_fedrec.models.ARCHITECTURES`.
      item_embedding: float32 [I, d], the item table.
      score_layers: (kernel [fan_in, fan_out], bias [fan_out]) pairs, the
        last with fan_out = 1; fan_in of the first is d ('score_function')
        or 2 d ('neural_cf'). Empty for 'matrix_factorization'.
      user_embedding: float32 [d] to bake in, or None: then
        'matrix_factorization' and 'neural_cf' take it as a signature input.
        Must be None for 'score_function'.
      split_first_layer: 'neural_cf' computed as HeteFedRec's tiers are
        (`models.RecommenderSpec.split_first_layer`).
      top_k: K of the `top_k` signature; I when I < K.
      name: Module name.
    """
    super().__init__(name=name)
    item_embedding = _float32_array(item_embedding, 'item_embedding', 2)
    score_layers = [
        (
            _float32_array(kernel, 'a kernel', 2),
            _float32_array(bias, 'a bias', 1),
        )
        for kernel, bias in score_layers
    ]
    spec = _checked_spec(architecture, item_embedding, score_layers,
                         split_first_layer)
    num_items, dim = item_embedding.shape
    params = collections.OrderedDict(item_embedding=item_embedding)
    if user_embedding is not None:
      if not spec.has_user_embedding:
        raise ValueError(f'{architecture} has no user embedding.')
      user_embedding = _float32_array(user_embedding, 'user_embedding', 1)
      if user_embedding.shape != (dim,):
        raise ValueError(
            f'user_embedding must be [{dim}]; got {user_embedding.shape}.'
        )
      params['user_embedding'] = user_embedding
    if score_layers:
      params['score_layers'] = [
          collections.OrderedDict(kernel=kernel, bias=bias)
          for kernel, bias in score_layers
      ]
    if top_k < 1:
      raise ValueError(f'top_k must be positive; got {top_k}.')
    self.k = min(top_k, num_items)
    self.model = models.RecommenderModel(
        spec, params,
        user_embedding=('input' if spec.has_user_embedding
                        and user_embedding is None else 'own'),
    )
    self.takes_user_embedding = self.model.takes_user_embedding

    item_ids = tf.TensorSpec([None], tf.int32, name='item_ids')
    exclude_ids = tf.TensorSpec([None], tf.int32, name='exclude_ids')
    if self.takes_user_embedding:
      user = tf.TensorSpec([dim], tf.float32, name='user_embedding')
      self.score = tf.function(self._score, input_signature=[item_ids, user])
      self.top_k = tf.function(
          self._top_k, input_signature=[exclude_ids, user]
      )
    else:
      self.score = tf.function(
          lambda item_ids: self._score(item_ids, None),
          input_signature=[item_ids],
      )
      self.top_k = tf.function(
          lambda exclude_ids: self._top_k(exclude_ids, None),
          input_signature=[exclude_ids],
      )

  @classmethod
  def from_model_parameters(
      cls,
      architecture: str,
      params,
      *,
      bake_user_embedding: bool = True,
      split_first_layer: bool = False,
      top_k: int = DEFAULT_TOP_K,
      name: str | None = None,
  ) -> 'OnDeviceRecommender':
    """The module of one user's `tff_fedrec.models` parameters (numpy).

    Args:
      architecture: One of `tff_fedrec.models.ARCHITECTURES`.
      params: Mapping with `item_embedding` [I, d] and, as the architecture
        has them, `user_embedding` [d] and `score_layers` (a list of
        mappings with `kernel` and `bias`), as `models.initial_parameters`
        returns them.
      bake_user_embedding: Bake `params['user_embedding']` in; if False,
        the signatures take `user_embedding` as input instead.
      split_first_layer: As in the constructor.
      top_k: K of the `top_k` signature.
      name: Module name.
    """
    layers = params.get('score_layers', ())
    return cls(
        architecture,
        params['item_embedding'],
        [(layer['kernel'], layer['bias']) for layer in layers],
        params.get('user_embedding') if bake_user_embedding else None,
        split_first_layer=split_first_layer,
        top_k=top_k,
        name=name,
    )

  @property
  def signatures(self) -> dict[str, tf.types.experimental.ConcreteFunction]:
    """{'score': ..., 'top_k': ...}, the concrete functions to export."""
    return {
        SCORE_SIGNATURE: self.score.get_concrete_function(),
        TOP_K_SIGNATURE: self.top_k.get_concrete_function(),
    }

  def _score(self, item_ids, user_embedding) -> dict[str, tf.Tensor]:
    return {'scores': self.model.score(item_ids, user_embedding)}

  def _top_k(self, exclude_ids, user_embedding) -> dict[str, tf.Tensor]:
    item_ids, scores = self.model.top_k(exclude_ids, self.k, user_embedding)
    return {'item_ids': item_ids, 'scores': scores}
