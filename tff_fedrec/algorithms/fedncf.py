"""FedNCF (Perifanis & Efraimidis 2022) as the PFedRec paper's baseline.

User embedding on the client; item embedding and the NCF MLP on [p_u; q_j]
aggregated (Sec. 6.2). With `training.dual_personalization` ("FedNCF w/
DualPer", Table 3) the MLP becomes the client's personal score function, the
updates alternate and fine-tuned item rows stay on the client.
"""

from typing import Optional

import tensorflow_federated as tff

from tff_fedrec import models
from tff_fedrec.algorithms import _partially_local_method
from tff_fedrec.algorithms import method
from tff_fedrec.algorithms import partially_local


def build_fedncf(
    *,
    num_items: int,
    embedding_dim: int = 32,
    hidden_units: tuple[int, ...] = models.DEFAULT_NCF_HIDDEN_UNITS,
    training: partially_local.ClientTrainingConfig = partially_local.ClientTrainingConfig(
        dual_personalization=False
    ),
    seed: int = 0,
    model_aggregator: Optional[tff.aggregators.UnweightedAggregationFactory] = None,
    item_aggregator: Optional[tff.aggregators.UnweightedAggregationFactory] = None,
) -> method.FederatedMethod:
  spec = models.RecommenderSpec(
      'neural_cf', num_items, embedding_dim,
      tuple(hidden_units) or models.DEFAULT_NCF_HIDDEN_UNITS,
      personal_score_layers=training.dual_personalization,
  )
  return _partially_local_method.build_method(
      spec,
      training,
      seed=seed,
      model_aggregator=model_aggregator,
      item_aggregator=item_aggregator,
  )
