"""The mean over a whole population of updates that only a round sends.

A round's clients upload their changes with weights w_i (the users each
simulates); a user outside the round changed nothing. The mean over the
population of N users is then

  mean = sum_i w_i v_i / N = (sum_i w_i v_i / sum_i w_i) * (sum_i w_i / N),

the inner weighted mean scaled by the round's share of the population.
Added to a model that is the mean of the N users' own models, it keeps that
model the mean of their models after the round, whatever share of them
trained: APFR-GKD with `client_start='own_model'` (each client trains from
its own model and uploads its change) keeps its global model the mean of the
client models, Eq. 1 over every client. With every user in the round the
share is 1 and this is the inner mean itself. A plain mean of the changes
would instead add up across rounds of disjoint clients: ten rounds of a
tenth of the users each would move the global model by ten clients' worth
of change.

Example:
  >>> factory = PopulationMeanFactory(tff.aggregators.MeanFactory(),
  ...                                 population=4)
  >>> process = factory.create(tff.TensorType(np.float32),
  ...                          tff.TensorType(np.float32))
  >>> process.next(process.initialize(), [2.0, 6.0], [1.0, 1.0]).result
  2.0  # (2 + 6) / 4: the two users outside the round changed nothing.
"""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


class PopulationMeanFactory(tff.aggregators.WeightedAggregationFactory):
  """`inner`'s weighted mean times (sum of weights) / `population`
  (module docstring). State and measurements are the inner process's."""

  def __init__(self, inner: tff.aggregators.WeightedAggregationFactory, *,
               population: int):
    if not isinstance(inner, tff.aggregators.WeightedAggregationFactory):
      raise TypeError('inner must be a weighted aggregation factory; got '
                      f'{type(inner).__name__}.')
    if population < 1:
      raise ValueError(f'population must be at least 1; got {population}.')
    self._inner = inner
    self._population = population

  def create(
      self, value_type, weight_type=tff.TensorType(np.float32)
  ) -> tff.templates.AggregationProcess:
    weight_type = tff.to_type(weight_type)
    if weight_type != tff.TensorType(np.float32):
      raise TypeError(f'Expected a float32 weight; got {weight_type}.')
    inner = self._inner.create(value_type, weight_type)
    mean_type = inner.next.type_signature.result.result.member
    population = float(self._population)

    @tff.tensorflow.computation(mean_type, np.float32)
    def scale(mean, total_weight):
      share = total_weight / population
      return tf.nest.map_structure(lambda x: x * share, mean)

    @tff.federated_computation(
        inner.initialize.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS),
    )
    def next_fn(state, value, weight):
      output = inner.next(state, value, weight)
      total_weight = tff.federated_sum(weight)
      return tff.templates.MeasuredProcessOutput(
          state=output.state,
          result=tff.federated_map(scale, (output.result, total_weight)),
          measurements=output.measurements,
      )

    return tff.templates.AggregationProcess(inner.initialize, next_fn)
