"""FedMF (Chai et al. 2020) as the PFedRec paper's baseline (Sec. 6.2).

User embedding p_u on the client, item embedding q_j aggregated, logit
<p_u, q_j>, joint local SGD. With `training.dual_personalization` it becomes
"FedMF w/ DualPer" (Table 3): alternating updates and fine-tuned item rows kept
on the client for scoring. Any exchange (`exchanges`) carries the table.
"""

from tff_fedrec import models
from tff_fedrec.algorithms import method
from tff_fedrec.algorithms.local_items import client_training
from tff_fedrec.algorithms.local_items import exchanges
from tff_fedrec.algorithms.local_items import item_method


def build_fedmf(
    *,
    data: method.RunData,
    seed: int = 0,
    embedding_dim: int = 32,
    hidden_units: tuple[int, ...] = (),
    training: client_training.ClientTrainingConfig = (
        client_training.ClientTrainingConfig(dual_personalization=False)),
    exchange=exchanges.BroadcastOptions(),
    item_aggregator=None,
    model_aggregator=None,
    tier_optimization: str = 'none',
) -> item_method.LocalItemMethod:
  """Builds FedMF; MF has no score layers, so `hidden_units` must be empty."""
  if hidden_units:
    raise ValueError('FedMF has no score layers; drop --hidden_units.')
  spec = models.RecommenderSpec(
      'matrix_factorization', data.num_items, embedding_dim
  )
  return item_method.build_method(
      spec, training, exchange, data=data, seed=seed,
      item_aggregator=item_aggregator, model_aggregator=model_aggregator,
      tier_optimization=tier_optimization,
  )
