"""Each entry of a structured upload aggregated by its own inner factory.

A client's upload is often several values that aggregate differently: item
rows by a row-sparse mean, an MLP's deltas by a weighted mean, counts by a
sum. `KeyedFactory` takes one inner factory per key of an `OrderedDict`
value and runs each on its entry; weighted inner factories get the
client's weight, unweighted ones the entry alone. State, result and
measurements are `OrderedDict`s with the same keys.

Example:
  >>> factory = KeyedFactory(collections.OrderedDict(
  ...     item=sparse_rows.RowSparseMeanFactory(num_items),
  ...     dense=tff.aggregators.MeanFactory()))
  >>> process = factory.create(upload_type, tff.TensorType(np.float32))
  >>> process.next(state, uploads, weights).result['item']  # [N, d] mean
"""

import collections
from collections.abc import Mapping

import numpy as np
import tensorflow_federated as tff


class KeyedFactory(tff.aggregators.WeightedAggregationFactory):
  """Aggregates value[k] with `inner[k]` for every key k (module docstring).

  An empty mapping aggregates the empty structure (a method that uploads
  nothing but its metrics).
  """

  def __init__(self, inner: Mapping[str, object]):
    for key, factory in inner.items():
      if not isinstance(
          factory,
          (tff.aggregators.WeightedAggregationFactory,
           tff.aggregators.UnweightedAggregationFactory),
      ):
        raise TypeError(
            f'inner[{key!r}] must be a tff.aggregators factory; got '
            f'{type(factory).__name__}.'
        )
    self._inner = collections.OrderedDict(inner)

  def create(
      self, value_type, weight_type=tff.TensorType(np.float32)
  ) -> tff.templates.AggregationProcess:
    value_type = tff.to_type(value_type)
    if isinstance(value_type, tff.StructType):
      names = [name for name, _ in tff.structure.iter_elements(value_type)]
    else:
      names = None
    if names != list(self._inner):
      raise TypeError(
          f'The value must be a structure with the keys {list(self._inner)}; '
          f'got {value_type}.'
      )
    weighted = collections.OrderedDict(
        (key, isinstance(factory, tff.aggregators.WeightedAggregationFactory))
        for key, factory in self._inner.items()
    )
    processes = collections.OrderedDict(
        (key, factory.create(value_type[key], weight_type)
         if weighted[key] else factory.create(value_type[key]))
        for key, factory in self._inner.items()
    )

    def zipped(values: collections.OrderedDict):
      if not values:
        return tff.federated_value(collections.OrderedDict(), tff.SERVER)
      return tff.federated_zip(values)

    @tff.federated_computation
    def initialize():
      return zipped(collections.OrderedDict(
          (key, process.initialize()) for key, process in processes.items()
      ))

    @tff.federated_computation(
        initialize.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS),
    )
    def next_fn(state, value, weight):
      outputs = collections.OrderedDict()
      for key, process in processes.items():
        arguments = (state[key], value[key])
        if weighted[key]:
          arguments += (weight,)
        outputs[key] = process.next(*arguments)
      return tff.templates.MeasuredProcessOutput(
          state=zipped(collections.OrderedDict(
              (key, output.state) for key, output in outputs.items()
          )),
          result=zipped(collections.OrderedDict(
              (key, output.result) for key, output in outputs.items()
          )),
          measurements=zipped(collections.OrderedDict(
              (key, output.measurements) for key, output in outputs.items()
          )),
      )

    return tff.templates.AggregationProcess(initialize, next_fn)
