"""FedNCF (Perifanis & Efraimidis 2022) as the PFedRec paper's baseline.

User embedding on the client; item embedding and the NCF MLP on [p_u; q_j]
aggregated (Sec. 6.2). With `training.dual_personalization` ("FedNCF w/
DualPer", Table 3) the MLP becomes the client's personal score function, the
updates alternate and fine-tuned item rows stay on the client. Any exchange
(`exchanges`) carries the table.
"""

from tff_fedrec import models
from tff_fedrec.algorithms import method
from tff_fedrec.algorithms.local_items import client_training
from tff_fedrec.algorithms.local_items import exchanges
from tff_fedrec.algorithms.local_items import item_method


def build_fedncf(
    *,
    data: method.RunData,
    seed: int = 0,
    embedding_dim: int = 32,
    hidden_units: tuple[int, ...] = models.DEFAULT_NCF_HIDDEN_UNITS,
    training: client_training.ClientTrainingConfig = (
        client_training.ClientTrainingConfig(dual_personalization=False)),
    exchange=exchanges.BroadcastOptions(),
    item_aggregator=None,
    model_aggregator=None,
    tier_optimization: str = 'none',
) -> item_method.LocalItemMethod:
  spec = models.RecommenderSpec(
      'neural_cf', data.num_items, embedding_dim,
      tuple(hidden_units) or models.DEFAULT_NCF_HIDDEN_UNITS,
      personal_score_layers=training.dual_personalization,
  )
  return item_method.build_method(
      spec, training, exchange, data=data, seed=seed,
      item_aggregator=item_aggregator, model_aggregator=model_aggregator,
      tier_optimization=tier_optimization,
  )
