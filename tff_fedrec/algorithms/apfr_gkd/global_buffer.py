"""APFR-GKD's buffer of global models and the teacher it broadcasts
(Zhao et al., Eq. 6-8, Algorithm 1 lines 10 and 15).

  BufferedGlobalModel   the finalizer: the round's aggregate applied, then
                        pushed into a buffer of the last M global models,
                        whose average is the teacher and, by default, the
                        next global model (Eq. 6);
  TeacherBroadcast      the distributor: the global model and that teacher,
                        with has_teacher = 0 until a model was buffered.

Both are roles of `templates.roles`, used by `apfr_gkd.method` alone.

Example:
  >>> finalizer = BufferedGlobalModel(global_initial, buffer_size=5)
  >>> distributor = TeacherBroadcast()
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec.templates import distributors
from tff_fedrec.templates import finalizers

BUFFER_STUDENT_STARTS = ('buffer_average', 'latest_aggregate')


class BufferedGlobalModel:
  """APFR-GKD Eq. 6: theta_t <- (1/M) sum_{m=1..M} theta_{t-m+1}.

  After `ApplyDelta`, the new global model is pushed into a FIFO buffer of
  the last M aggregated models (theta_0 is not pushed; before M pushes the
  average runs over those present), and their uniform parameter average
  becomes the teacher clients distil from (`TeacherBroadcast`
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
    self._inner = finalizers.ApplyDelta()

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
          finalizers.as_structure_of(aggregated, state['models']), aggregated,
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

    new_state, new_global, measurements = finalizers.map_on_server(push, state, aggregated)
    return new_state, new_global, measurements


class TeacherBroadcast(distributors.Broadcast):
  """B = <global_parameters, round_num, teacher, has_teacher>: the
  broadcast and the teacher of `BufferedGlobalModel` (its
  state's `teacher`, the average of the buffered global models; APFR-GKD
  Eq. 6-8), with has_teacher = 1.0 once a model was buffered and 0.0
  before (the round-1 teacher would be the random theta_0, from which
  FedGKD does not distil)."""

  def received_type(self, global_type) -> tff.Type:
    return tff.to_type(collections.OrderedDict(
        global_parameters=global_type, round_num=np.int32,
        teacher=global_type, has_teacher=np.float32,
    ))

  def distribute(self, server_state):
    buffer = server_state.finalizer
    has_teacher = tff.federated_map(
        tff.tensorflow.computation(
            lambda pushes: tf.cast(pushes > 0, tf.float32), np.int32),
        buffer.pushes,
    )
    return tff.federated_broadcast(tff.federated_zip(collections.OrderedDict(
        global_parameters=server_state.global_parameters,
        round_num=server_state.round_num,
        teacher=buffer.teacher,
        has_teacher=has_teacher,
    )))
