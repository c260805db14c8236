"""Heterogeneous-size recommenders of HeteFedRec (Yuan et al., ICDE 2024).

Each tier a in (small, medium, large) has its own public parameters
{V_a, Theta_a} (Sec. IV.A): an item table V_a [I, N_a] with N_s < N_m < N_l
and a feed-forward scorer Theta_a of widths [2 N_a, 8, 8] then 1 (Sec. V.D),
applied to [u ; v] (Fed-NCF, Eq. 5). User embeddings u_i [N_a] are private.

Base models (Sec. III.B, `HeteroSpec.model`): 'ncf' scores FFN([u ; v]);
'lightgcn' first runs one LightGCN propagation on the user's local graph (the
user and the items it interacted with, each such item linked to this user
only): u' = (u + sum_{j in N_u} v_j / sqrt(|N_u|)) / 2, the mean of layers 0
and 1 with LightGCN's 1 / sqrt(|N_u| |N_j|) weights and |N_j| = 1. Items keep
v_j: propagating the user into its own positives' vectors would mark them
apart from every negative and every test item, which are not in the graph.

The tables start from one point on their shared prefix (Sec. IV.B, Eq. 10):
V_m[:, :N_s] = V_l[:, :N_s] = V_s and V_l[:, N_s:N_m] = V_m[:, N_s:N_m],
so padding-aware aggregation keeps them equal there (until distillation).

Example:
  >>> spec = HeteroSpec(num_items=5, widths=(2, 4, 8))
  >>> [t.shape for t in initial_parameters(spec, seed=0)['item_tables']]
  [(5, 2), (5, 4), (5, 8)]
"""

import collections
import dataclasses

import numpy as np
import tensorflow as tf

from tff_fedrec import models
from tff_fedrec import scoring

NUM_TIERS = 3
MODELS = ('ncf', 'lightgcn')


@dataclasses.dataclass(frozen=True)
class HeteroSpec:
  """Sizes of the three tiers' models.

  Attributes:
    num_items: I.
    widths: (N_s, N_m, N_l), strictly increasing (8, 16, 32 in Sec. V.D).
    hidden_units: Hidden layers of every tier's scorer ([8, 8] in Sec. V.D).
    init_scale: Standard deviation of the N(0, s^2) initial embeddings.
    model: 'ncf' (Fed-NCF) or 'lightgcn' (Fed-LightGCN), see above.
    neighbor_gradient: 'lightgcn' only. True (plain autodiff of the
      propagation): an item vector v_j also learns through the user
      vectors u' it is a neighbour in. False: u' treats sum_j v_j as a
      constant in training (`tf.stop_gradient`), so items learn as
      candidates only; scores are unchanged. With the 4:1 binary
      cross-entropy of Sec. V.D, training through the neighbour path made
      Fed-LightGCN rank below random for a while (docs/results/hetefedrec.md, Fed-LightGCN:
      measured with and without it).
  """

  num_items: int
  widths: tuple[int, int, int] = (8, 16, 32)
  hidden_units: tuple[int, ...] = (8, 8)
  init_scale: float = 0.01
  model: str = 'ncf'
  neighbor_gradient: bool = True

  def __post_init__(self):
    if len(self.widths) != NUM_TIERS or any(
        a >= b for a, b in zip(self.widths, self.widths[1:])
    ) or self.widths[0] < 1:
      raise ValueError(
          f'widths must be 3 increasing positive sizes; got {self.widths}.'
      )
    if self.num_items < 1:
      raise ValueError('num_items must be positive.')
    if self.model not in MODELS:
      raise ValueError(f'model must be one of {MODELS}; got {self.model!r}.')
    if not self.neighbor_gradient and self.model != 'lightgcn':
      raise ValueError(
          'neighbor_gradient=False applies to the lightgcn model only.'
      )

  def layer_shapes(self, tier: int) -> tuple[tuple[int, int], ...]:
    """(fan_in, fan_out) of Theta_tier's dense layers."""
    return score_layer_shapes(self.widths[tier], self.hidden_units)


def score_layer_shapes(
    width: int, hidden_units
) -> tuple[tuple[int, int], ...]:
  """(fan_in, fan_out) of the dense layers of Eq. 5's scorer
  FFN([u ; v]) for embeddings of size `width`: [2 width, *hidden, 1]."""
  fan_in = 2 * width
  shapes = []
  for units in (*hidden_units, 1):
    shapes.append((fan_in, units))
    fan_in = units
  return tuple(shapes)


def initial_parameters(spec: HeteroSpec, seed: int) -> collections.OrderedDict:
  """Public parameters {V_a, Theta_a} for a = s, m, l (numpy float32).

  Returns `OrderedDict(item_tables=[V_s, V_m, V_l], score_layers=[Theta_s,
  Theta_m, Theta_l])`, each Theta a list of `OrderedDict(kernel, bias)`
  initialised uniformly in +-1/sqrt(fan_in).
  """
  rng = np.random.default_rng(seed)
  largest = rng.normal(
      scale=spec.init_scale, size=(spec.num_items, spec.widths[-1])
  ).astype(np.float32)
  tables = [largest[:, :width].copy() for width in spec.widths]
  score_layers = [
      models.initial_dense_layers(rng, spec.layer_shapes(tier))
      for tier in range(NUM_TIERS)
  ]
  return collections.OrderedDict(item_tables=tables, score_layers=score_layers)


def initial_user_embeddings(
    spec: HeteroSpec, num_users: int, seed: int
) -> np.ndarray:
  """Private u_i, N(0, s^2), stored at the largest width [U, N_l]; a tier-a
  user reads its first N_a entries."""
  rng = np.random.default_rng([seed, 1])
  return rng.normal(
      scale=spec.init_scale, size=(num_users, spec.widths[-1])
  ).astype(np.float32)


def logits(user, item_vectors, layers) -> tf.Tensor:
  """Eq. 5 before the sigmoid: FFN([u ; v]) for user [..., N] and item
  vectors [..., C, N] (or [C, N], the same C items for every user);
  returns [..., C].

  The first layer is linear in [u ; v], so it splits into a user part
  [..., 1, h] and an item part [..., C, h] that are added per pair: no
  [..., C, 2N] concatenation of u repeated C times
  (`scoring.neural_cf_logits`, the same function written with it).
  Kernels [f_in, f_out] and biases [f_out] are shared; kernels
  [U, f_in, f_out] and biases [U, f_out] give each of U users its own
  model ('Standalone'). The math is `scoring.neural_cf_logits` with
  `split_first_layer`, the function a tier's model on a phone runs
  (`models.RecommenderModel`).
  """
  return scoring.neural_cf_logits(
      item_vectors, user,
      [(layer['kernel'], layer['bias']) for layer in layers],
      split_first_layer=True,
  )


def score_all_items(user, table, layers) -> tf.Tensor:
  """`logits` of every item for each user: user [U, N] with one shared model
  (table [I, N], kernels [f_in, f_out], biases [f_out]) or with one model
  per user (table [U, I, N], kernels [U, f_in, f_out], biases [U, f_out],
  the 'Standalone' baseline); returns [U, I]."""
  return logits(user, table, layers)


def user_representation(spec: HeteroSpec, user, neighbor_sum, num_neighbors):
  """The user vector the scorer sees: u for 'ncf'; for 'lightgcn'
  (u + neighbor_sum / sqrt(|N_u|)) / 2 with neighbor_sum = sum of the user's
  interacted items' vectors [..., N] and num_neighbors = |N_u| [...]; no
  gradient reaches neighbor_sum unless `spec.neighbor_gradient`."""
  if spec.model == 'ncf':
    return user
  if not spec.neighbor_gradient:
    neighbor_sum = tf.stop_gradient(neighbor_sum)
  scale = tf.math.rsqrt(tf.maximum(tf.cast(num_neighbors, tf.float32), 1.0))
  return 0.5 * (user + neighbor_sum * scale[..., None])
