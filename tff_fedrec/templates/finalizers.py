"""The server's step from the round's aggregate: the finalizer role.

A finalizer of `composer.compose_client_state_process` has
  initial_state: a `tff.tensorflow.computation` ( -> its server state);
  finalize(state, global_parameters, aggregate, round_num): called while
    tracing the server step, all SERVER-placed; returns (new state, new
    global parameters, measurements).

  ApplyDelta                  global + the aggregated delta (FedAvg's server
                              step at rate 1; PFedRec Algorithm 1 line 6,
                              FedRAS Sec. 4.4); with `replaces_trained_rows`,
                              trained item rows take the aggregate's value
                              (FedRAS-E).
  ServerAdam                  an Adam step on the aggregated gradient, the
                              moments kept as state (HeteFedRec Eq. 9, 15).
  SubtractChanges             x <- x - the aggregated change (clients took
                              the steps; HeteFedRec Eq. 4 with local Adam).
  WithEnsembleDistillation    any of these, then relation-based ensemble
                              self-distillation of the item tables
                              (HeteFedRec Eq. 16-17, RESKD).
  BufferedGlobalModel         ApplyDelta, then the new global model into a
                              buffer of the last M, whose average is the
                              next teacher and, by default, the next
                              global model (APFR-GKD Eq. 6).

Each builds its TF computation from the types of the values it is traced
with, so a finalizer is made without types.
"""

import collections

import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import adam
from tff_fedrec.algorithms.hetefedrec import reskd


@tff.tensorflow.computation
def _no_state():
  return collections.OrderedDict()


def _member_types(*values):
  return [value.type_signature.member for value in values]


def _map(fn, *values):
  """federated_map of `fn` traced with the values' member types."""
  return tff.federated_map(
      tff.tensorflow.computation(fn, *_member_types(*values)), values
  )


def _item_delta(item_aggregate):
  """The [N, d] delta of an item aggregate: the tensor itself (a mean), or
  the `update` of <update, participants> (`clustered_actions`)."""
  if isinstance(item_aggregate, tf.Tensor):
    return item_aggregate
  return item_aggregate['update']


class ApplyDelta:
  """new = global + aggregate, key by key (module docstring).

  The aggregate is <item: the item-table delta (or <update,
  participants>), dense: <one delta per other global key>> (no `dense`
  entry when there is none); keys of the global parameters absent from it
  stay as they are.
  """

  initial_state = _no_state

  def __init__(self, *, replaces_trained_rows: bool = False):
    self._replaces_trained_rows = replaces_trained_rows

  def finalize(self, state, global_parameters, aggregate, round_num):
    del round_num
    replaces = self._replaces_trained_rows

    def apply(global_parameters, aggregate):
      updated = collections.OrderedDict(global_parameters)
      if 'item' in aggregate:
        item = aggregate['item']
        table = global_parameters['item_embedding']
        if replaces:
          trained = item['participants'][:, tf.newaxis] > 0
          updated['item_embedding'] = tf.where(trained, item['update'], table)
        else:
          updated['item_embedding'] = table + _item_delta(item)
      if 'dense' in aggregate:
        for key, delta in aggregate['dense'].items():
          updated[key] = tf.nest.map_structure(
              tf.add, global_parameters[key], delta
          )
      return updated

    new_global = _map(apply, global_parameters, aggregate)
    return state, new_global, tff.federated_value(
        collections.OrderedDict(), tff.SERVER
    )


def _as_parameters(global_parameters, aggregate):
  """The aggregate in the nest of the global parameters (same leaf order,
  whatever sequence types TFF returns)."""
  return tf.nest.pack_sequence_as(
      global_parameters, tf.nest.flatten(aggregate)
  )


class ServerAdam:
  """x <- Adam(x, g) with g the aggregate; state <m, v, step>."""

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
          _as_parameters(state['m'], aggregate),
          adam.AdamState(**state),
          learning_rate=learning_rate,
      )
      return collections.OrderedDict(
          m=optimizer.m, v=optimizer.v, step=optimizer.step
      ), params

    new_state, new_global = _map(step, state, global_parameters, aggregate)
    return new_state, new_global, tff.federated_value(
        collections.OrderedDict(), tff.SERVER
    )


class SubtractChanges:
  """x <- x - d, d the aggregated change (the clients took the steps)."""

  initial_state = _no_state

  def finalize(self, state, global_parameters, aggregate, round_num):
    del round_num

    def subtract(global_parameters, aggregate):
      return tf.nest.map_structure(
          tf.subtract, global_parameters,
          _as_parameters(global_parameters, aggregate),
      )

    return state, _map(subtract, global_parameters, aggregate), (
        tff.federated_value(collections.OrderedDict(), tff.SERVER)
    )


class WithEnsembleDistillation:
  """`inner`, then RESKD on the new `item_tables` (HeteFedRec Eq. 16-17).

  Each round distils the tables on |V_kd| = `num_items` items drawn by a
  shuffle seeded by (seed, round); measurements <loss_before [tiers],
  loss_after [tiers]> of Eq. 17's loss per table.
  """

  def __init__(self, inner, *, num_items: int, learning_rate: float,
               seed: int):
    self._inner = inner
    self._num_items = num_items
    self._learning_rate = learning_rate
    self._seed = seed
    self.initial_state = inner.initial_state

  def finalize(self, state, global_parameters, aggregate, round_num):
    state, new_global, inner_measurements = self._inner.finalize(
        state, global_parameters, aggregate, round_num
    )
    subset, learning_rate, seed = (
        self._num_items, self._learning_rate, self._seed)

    def distil(params, round_num):
      tables = list(params['item_tables'])
      num_items = tables[0].shape[0]
      item_ids = tf.random.experimental.stateless_shuffle(
          tf.range(num_items),
          seed=tf.stack([tf.constant(seed, tf.int64),
                         tf.cast(round_num, tf.int64)]),
      )[: min(subset, num_items)]
      result = reskd.ensemble_distillation(
          tables, item_ids, learning_rate=learning_rate, step_rule='adam',
      )
      distilled = collections.OrderedDict(params)
      distilled['item_tables'] = list(result.tables)
      return distilled, collections.OrderedDict(
          loss_before=tf.stack(result.loss_before),
          loss_after=tf.stack(result.loss_after),
      )

    new_global, measurements = _map(distil, new_global, round_num)
    return state, new_global, tff.federated_zip(collections.OrderedDict(
        optimizer=inner_measurements, distillation=measurements,
    ))


BUFFER_STUDENT_STARTS = ('buffer_average', 'latest_aggregate')


class BufferedGlobalModel:
  """APFR-GKD Eq. 6: theta_t <- (1/M) sum_{m=1..M} theta_{t-m+1}.

  After `ApplyDelta`, the new global model is pushed into a FIFO buffer of
  the last M aggregated models (theta_0 is not pushed; before M pushes the
  average runs over those present), and their uniform parameter average
  becomes the teacher clients distil from (`distributors.TeacherBroadcast`
  sends it). With `student_start='buffer_average'` (Algorithm 1, line 15)
  it is also the next global model clients start from; with
  'latest_aggregate' (FedGKD, Yao et al.) they start from the newest
  aggregate and only the teacher is the average.

  State <models: the buffer, each leaf stacked [M, ...], slot m holding
  push number m mod M; pushes: int32, models pushed so far; teacher: the
  average>. Measurements <buffered: int32, models in the average>. The
  state is server state, so checkpoints carry it and a resumed run
  continues with the same buffer.
  """

  def __init__(self, initial_parameters, *, buffer_size: int,
               student_start: str = 'buffer_average'):
    """`initial_parameters`: numpy arrays in the nest of the global
    parameters (theta_0: the teacher until the first push)."""
    if buffer_size < 1:
      raise ValueError(f'buffer_size must be at least 1; got {buffer_size}.')
    if student_start not in BUFFER_STUDENT_STARTS:
      raise ValueError(f'student_start must be one of '
                       f'{BUFFER_STUDENT_STARTS}; got {student_start!r}.')
    self._buffer_size = buffer_size
    self._student_start = student_start
    self._inner = ApplyDelta()

    @tff.tensorflow.computation
    def initial_state():
      return collections.OrderedDict(
          models=tf.nest.map_structure(
              lambda x: tf.zeros([buffer_size, *x.shape], x.dtype),
              initial_parameters,
          ),
          pushes=tf.constant(0, tf.int32),
          teacher=tf.nest.map_structure(tf.constant, initial_parameters),
      )

    self.initial_state = initial_state

  def finalize(self, state, global_parameters, aggregate, round_num):
    _, aggregated, _ = self._inner.finalize(
        tff.federated_value(collections.OrderedDict(), tff.SERVER),
        global_parameters, aggregate, round_num,
    )
    buffer_size = self._buffer_size
    to_average = self._student_start == 'buffer_average'

    def push(state, aggregated):
      slot = tf.math.floormod(state['pushes'], buffer_size)
      models = tf.nest.map_structure(
          lambda stack, new: tf.tensor_scatter_nd_update(
              stack, [[slot]], new[tf.newaxis]),
          _as_parameters(aggregated, state['models']), aggregated,
      )
      pushes = state['pushes'] + 1
      buffered = tf.minimum(pushes, buffer_size)
      weights = tf.cast(tf.range(buffer_size) < buffered, tf.float32) / (
          tf.cast(buffered, tf.float32))
      teacher = tf.nest.map_structure(
          lambda stack: tf.tensordot(weights, stack, axes=1), models
      )
      new_global = teacher if to_average else aggregated
      return (
          collections.OrderedDict(models=models, pushes=pushes,
                                  teacher=teacher),
          new_global,
          collections.OrderedDict(buffered=buffered),
      )

    new_state, new_global, measurements = _map(push, state, aggregated)
    return new_state, new_global, measurements
