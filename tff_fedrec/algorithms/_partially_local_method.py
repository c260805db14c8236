"""Builds a `FederatedMethod` on the partially local process (shared by methods)."""

from typing import Optional

import tensorflow_federated as tff

from tff_fedrec import models
from tff_fedrec.algorithms import method
from tff_fedrec.algorithms import partially_local


def build_method(
    spec: models.RecommenderSpec,
    training: partially_local.ClientTrainingConfig,
    *,
    seed: int,
    model_aggregator: Optional[tff.aggregators.UnweightedAggregationFactory],
    item_aggregator: Optional[tff.aggregators.UnweightedAggregationFactory],
) -> method.FederatedMethod:
  params = models.initial_parameters(spec, seed)
  return method.FederatedMethod(
      spec=spec,
      initial_parameters=params,
      initial_client_state=partially_local.initial_client_state(spec, params),
      process=partially_local.build_partially_local_process(
          spec,
          params,
          training,
          item_aggregator=item_aggregator,
          model_aggregator=model_aggregator,
      ),
  )
