"""PFedRec: dual personalization (Zhang et al., IJCAI 2023).

Item embedding global and fine-tuned per user, score function S_i (one dense
layer; an MLP with `hidden_units`) kept on the device, no user embedding
(Sec. 4.1, Eq. 5-7); alternating local updates (Algorithm 1). The item
table travels through any exchange (`exchanges`): broadcast by default, with
LDP (Sec. 6.6) as an option, or FedRAS's compressed actions
(`fedras.exchange.FedRASOptions`), which no paper combines with it.

Example:
  >>> method = build_pfedrec(data=run_data, embedding_dim=32, seed=0)
  >>> method.spec.local_keys
  ('score_layers',)
"""

from tff_fedrec import models
from tff_fedrec.algorithms import method
from tff_fedrec.algorithms.local_items import client_training
from tff_fedrec.algorithms.local_items import exchanges
from tff_fedrec.algorithms.local_items import item_method


def build_pfedrec(
    *,
    data: method.RunData,
    seed: int = 0,
    embedding_dim: int = 32,
    hidden_units: tuple[int, ...] = (),
    training: client_training.ClientTrainingConfig = (
        client_training.ClientTrainingConfig()),
    exchange=exchanges.BroadcastOptions(),
    item_aggregator=None,
    model_aggregator=None,
    tier_optimization: str = 'none',
) -> item_method.LocalItemMethod:
  """Builds PFedRec; `training.dual_personalization` must stay True."""
  if not training.dual_personalization:
    raise ValueError(
        'PFedRec is the dual personalization mechanism; for the same model '
        'without it use --method=fedmf.'
    )
  spec = models.RecommenderSpec(
      'score_function', data.num_items, embedding_dim, tuple(hidden_units),
      personal_score_layers=True,
  )
  return item_method.build_method(
      spec, training, exchange, data=data, seed=seed,
      item_aggregator=item_aggregator, model_aggregator=model_aggregator,
      tier_optimization=tier_optimization,
  )
