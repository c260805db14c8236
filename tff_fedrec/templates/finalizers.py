"""The server's step from the round's aggregate: generic finalizers.

A finalizer plays `roles.Finalizer`:
  initial_state: a `tff.tensorflow.computation` ( -> its server state);
  finalize(state, global_parameters, aggregate, round_num): called while
    tracing the server step, all SERVER-placed; returns (new state, new
    global parameters, measurements).

  ApplyDelta        global + the aggregated delta, for every parameter the
                    aggregate holds (FedAvg's server step at rate 1,
                    McMahan et al. 2017).
  ServerAdam        an Adam step on the aggregated gradient, the moments
                    kept as state (Kingma & Ba 2015, Algorithm 1).
  ServerAdagrad     an Adagrad step on the aggregated pseudo-gradient with
                    PyTorch's semantics (Duchi et al. 2011; RF²'s server
                    optimizer): accumulator from `initial_accumulator`
                    (0), eps outside the root.
  SubtractChanges   x <- x - the aggregated change (the clients took the
                    steps).

They work on any nested structure of global parameters (`tf.nest`): an
`OrderedDict` of named parameters, each a tensor or a nest of tensors.
A method's own server step (a distillation after the step, a buffer of
global models, rows replaced rather than moved) lives in its package
under `algorithms/`.

Each builds its TF computation from the types of the values it is traced
with, so a finalizer is made without types.

Example:
  >>> finalizer = ApplyDelta()
  >>> state, new_global, _ = finalizer.finalize(
  ...     state, global_parameters, aggregate, round_num)  # while tracing
"""

import collections

import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import adam


@tff.tensorflow.computation
def _no_state():
  return collections.OrderedDict()


def no_measurements():
  """The empty measurements, SERVER-placed."""
  return tff.federated_value(collections.OrderedDict(), tff.SERVER)


def map_on_server(fn, *values):
  """`tff.federated_map` of `fn` (plain TF), traced with the member types
  of the SERVER-placed `values`."""
  return tff.federated_map(
      tff.tensorflow.computation(
          fn, *[value.type_signature.member for value in values]),
      values,
  )


def as_structure_of(reference, value):
  """`value` in the nest of `reference` (same leaf order, whatever
  sequence types TFF returns)."""
  return tf.nest.pack_sequence_as(reference, tf.nest.flatten(value))


def add_delta(global_parameters, delta) -> collections.OrderedDict:
  """TF: the global parameters with `delta` added to those it holds.

  Args:
    global_parameters: A mapping of named parameters (each a tensor or a
      nest of tensors).
    delta: A mapping whose keys are some of those names, each in its
      parameter's nest; the parameters it does not name stay as they are.
  """
  updated = collections.OrderedDict(global_parameters)
  for key, value in delta.items():
    updated[key] = tf.nest.map_structure(
        tf.add, global_parameters[key],
        as_structure_of(global_parameters[key], value),
    )
  return updated


class ApplyDelta:
  """new = global + aggregate, for the parameters the aggregate holds
  (`add_delta`): the aggregate maps some of the global parameters' names
  to their deltas, e.g. <table, layers> of a mean over
  users, or nothing at all (a method whose clients share nothing)."""

  initial_state = _no_state

  def finalize(self, state, global_parameters, aggregate, round_num):
    del round_num
    return state, map_on_server(add_delta, global_parameters, aggregate), (
        no_measurements())


class ServerAdam:
  """x <- Adam(x, g) with g the aggregate, in the nest of the global
  parameters; state <m, v, step>."""

  def __init__(self, initial_parameters, *, learning_rate: float):
    """`initial_parameters`: numpy arrays in the nest of the global
    parameters (their shapes and dtypes give the moments')."""
    self._learning_rate = learning_rate

    @tff.tensorflow.computation
    def initial_state():
      zeros = tf.nest.map_structure(
          lambda x: tf.zeros(x.shape, x.dtype), initial_parameters
      )
      return collections.OrderedDict(m=zeros, v=zeros, step=tf.constant(0.0))

    self.initial_state = initial_state

  def finalize(self, state, global_parameters, aggregate, round_num):
    del round_num
    learning_rate = self._learning_rate

    def step(state, global_parameters, aggregate):
      params, optimizer = adam.apply(
          global_parameters,
          as_structure_of(state['m'], aggregate),
          adam.AdamState(**state),
          learning_rate=learning_rate,
      )
      return collections.OrderedDict(
          m=optimizer.m, v=optimizer.v, step=optimizer.step
      ), params

    new_state, new_global = map_on_server(
        step, state, global_parameters, aggregate)
    return new_state, new_global, no_measurements()


def adagrad_step(parameters, accumulator, gradient, *, learning_rate: float,
                 epsilon: float):
  """TF, any nest: (new parameters, new accumulator) of PyTorch's Adagrad
  (no decay, no weight decay): s <- s + g^2; x <- x - lr g / (sqrt(s) +
  eps). TFF's `build_adagrad` differs: accumulator from 0.1, eps inside
  the root."""
  accumulator = tf.nest.map_structure(
      lambda s, g: s + tf.square(g), accumulator, gradient)
  parameters = tf.nest.map_structure(
      lambda x, s, g: x - learning_rate * g / (tf.sqrt(s) + epsilon),
      parameters, accumulator, gradient)
  return parameters, accumulator


class ServerAdagrad:
  """x <- Adagrad(x, g), g the aggregate, as PyTorch's `optim.Adagrad`
  (`adagrad_step`); state <accumulator>."""

  def __init__(self, initial_parameters, *, learning_rate: float,
               initial_accumulator: float = 0.0, epsilon: float = 1e-10):
    """`initial_parameters`: numpy arrays in the nest of the global
    parameters (their shapes give the accumulator's)."""
    self._learning_rate, self._epsilon = learning_rate, epsilon

    @tff.tensorflow.computation
    def initial_state():
      return collections.OrderedDict(accumulator=tf.nest.map_structure(
          lambda x: tf.fill(x.shape, tf.constant(initial_accumulator,
                                                 x.dtype)),
          initial_parameters))

    self.initial_state = initial_state

  def finalize(self, state, global_parameters, aggregate, round_num):
    del round_num
    learning_rate, epsilon = self._learning_rate, self._epsilon

    def step(state, global_parameters, aggregate):
      params, accumulator = adagrad_step(
          global_parameters, as_structure_of(global_parameters,
                                             state['accumulator']),
          as_structure_of(global_parameters, aggregate),
          learning_rate=learning_rate, epsilon=epsilon)
      return collections.OrderedDict(accumulator=accumulator), params

    new_state, new_global = map_on_server(
        step, state, global_parameters, aggregate)
    return new_state, new_global, no_measurements()


class SubtractChanges:
  """x <- x - d, d the aggregated change in the nest of the global
  parameters (the clients took the steps)."""

  initial_state = _no_state

  def finalize(self, state, global_parameters, aggregate, round_num):
    del round_num

    def subtract(global_parameters, aggregate):
      return tf.nest.map_structure(
          tf.subtract, global_parameters,
          as_structure_of(global_parameters, aggregate),
      )

    return state, map_on_server(subtract, global_parameters, aggregate), (
        no_measurements())
