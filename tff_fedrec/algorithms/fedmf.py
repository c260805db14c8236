"""FedMF (Chai et al. 2020) as the PFedRec paper's baseline (Sec. 6.2).

User embedding p_u on the client, item embedding q_j aggregated, logit
<p_u, q_j>, joint local SGD. With `training.dual_personalization` it becomes
"FedMF w/ DualPer" (Table 3): alternating updates and fine-tuned item rows kept
on the client for scoring.
"""

from typing import Optional

import tensorflow_federated as tff

from tff_fedrec import models
from tff_fedrec.algorithms import _partially_local_method
from tff_fedrec.algorithms import method
from tff_fedrec.algorithms import partially_local


def build_fedmf(
    *,
    num_items: int,
    embedding_dim: int = 32,
    hidden_units: tuple[int, ...] = (),
    training: partially_local.ClientTrainingConfig = partially_local.ClientTrainingConfig(
        dual_personalization=False
    ),
    seed: int = 0,
    model_aggregator: Optional[tff.aggregators.UnweightedAggregationFactory] = None,
    item_aggregator: Optional[tff.aggregators.UnweightedAggregationFactory] = None,
) -> method.FederatedMethod:
  """Builds FedMF; MF has no score layers, so `hidden_units` must be empty."""
  if hidden_units:
    raise ValueError('FedMF has no score layers; drop --hidden_units.')
  spec = models.RecommenderSpec(
      'matrix_factorization', num_items, embedding_dim
  )
  return _partially_local_method.build_method(
      spec,
      training,
      seed=seed,
      model_aggregator=model_aggregator,
      item_aggregator=item_aggregator,
  )
