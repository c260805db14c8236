"""PFedRec: dual personalization (Zhang et al., IJCAI 2023).

Item embedding global and fine-tuned per user, score function S_i (one dense
layer; an MLP with `hidden_units`) kept on the device, no user embedding
(Sec. 4.1, Eq. 5-7); alternating local updates (Algorithm 1).

Example:
  >>> method = build_pfedrec(num_items=1682, embedding_dim=32, seed=0)
  >>> method.spec.local_keys
  ('score_layers',)
"""

from typing import Optional

import tensorflow_federated as tff

from tff_fedrec import models
from tff_fedrec.algorithms import _partially_local_method
from tff_fedrec.algorithms import method
from tff_fedrec.algorithms import partially_local


def build_pfedrec(
    *,
    num_items: int,
    embedding_dim: int = 32,
    hidden_units: tuple[int, ...] = (),
    training: partially_local.ClientTrainingConfig = partially_local.ClientTrainingConfig(),
    seed: int = 0,
    model_aggregator: Optional[tff.aggregators.UnweightedAggregationFactory] = None,
    item_aggregator: Optional[tff.aggregators.UnweightedAggregationFactory] = None,
) -> method.FederatedMethod:
  """Builds PFedRec; `training.dual_personalization` must stay True."""
  if not training.dual_personalization:
    raise ValueError(
        'PFedRec is the dual personalization mechanism; for the same model '
        'without it use --method=fedmf.'
    )
  spec = models.RecommenderSpec(
      'score_function', num_items, embedding_dim, tuple(hidden_units),
      personal_score_layers=True,
  )
  return _partially_local_method.build_method(
      spec,
      training,
      seed=seed,
      model_aggregator=model_aggregator,
      item_aggregator=item_aggregator,
  )
