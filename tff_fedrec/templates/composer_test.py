"""The composer and the finalizers, on toy roles, against numpy.

Every process here is composed from a broadcast, a toy client work whose
users upload a given vector, a keyed aggregation and a finalizer; the
expected server states are written out with numpy.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec.algorithms.hetefedrec import reskd
from tff_fedrec.aggregators import keyed
from tff_fedrec.programs import execution
from tff_fedrec.templates import composer
from tff_fedrec.templates import distributors
from tff_fedrec.templates import finalizers
from tff_fedrec.templates import two_phase

_GLOBAL = collections.OrderedDict(w=np.array([1.0, -2.0], np.float32))
_DATA_TYPE = collections.OrderedDict(
    upload=tff.TensorType(np.float32, [None, 2]),
    loss=tff.TensorType(np.float32, [None]),
)


@pytest.fixture(scope='module', autouse=True)
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


def _initial(params):

  @tff.tensorflow.computation
  def initial():
    return tf.nest.map_structure(tf.constant, params)

  return initial


def _dense_mean_upload(received, data):
  del received
  return collections.OrderedDict(dense=collections.OrderedDict(
      w=tf.reduce_mean(data['upload'], axis=0)))


def _client_work(global_type, upload=_dense_mean_upload):
  """Users upload `upload(received, data)`; each adds the round number and
  the first global entry to its local state."""

  @tff.tensorflow.computation(
      distributors.Broadcast().received_type(global_type),
      tff.TensorType(np.float32, [None]), _DATA_TYPE,
  )
  def client_update(received, local, data):
    users = tf.cast(tf.shape(local)[0], tf.float32)
    first = tf.reshape(
        tf.nest.flatten(received['global_parameters'])[0], [-1])[0]
    new_local = local + tf.cast(received['round_num'], tf.float32) + first
    update = upload(received, data)
    metrics = collections.OrderedDict(
        loss_sum=tf.reduce_sum(data['loss']), num_examples=users)
    return new_local, collections.OrderedDict(
        update=update, weight=users, metrics=metrics)

  return composer.ClientWork(client_update)


def _process(finalizer, params=_GLOBAL, upload=_dense_mean_upload,
             factory=keyed.KeyedFactory(collections.OrderedDict(
                 dense=tff.aggregators.MeanFactory()))):
  initial = _initial(params)
  work = _client_work(initial.type_signature.result, upload)
  return composer.compose_client_state_process(
      initial_global_parameters=initial,
      distributor=distributors.Broadcast(),
      client_work=work,
      aggregator=factory.create(
          work.upload_type.update, tff.TensorType(np.float32)),
      finalizer=finalizer,
  )


# Two TFF clients: one of two users, one of one user.
_LOCALS = [np.array([0.0, 10.0], np.float32), np.array([5.0], np.float32)]
_DATA = [
    collections.OrderedDict(
        upload=np.array([[1.0, 1.0], [3.0, -1.0]], np.float32),
        loss=np.array([0.5, 1.5], np.float32)),
    collections.OrderedDict(
        upload=np.array([[4.0, 2.0]], np.float32),
        loss=np.array([3.0], np.float32)),
]
# Each client uploads its users' mean with weight U: (2 x [2, 0] + 1 x
# [4, 2]) / 3 is the mean over the three users.
_MEAN = np.array([8.0 / 3.0, 2.0 / 3.0], np.float32)


def _names(struct_type):
  return [name for name, _ in tff.structure.iter_elements(struct_type)]


def test_a_round_is_distribute_work_aggregate_finalize():
  process = _process(finalizers.ApplyDelta())
  assert isinstance(process, two_phase.TwoPhaseProcess)
  state = process.initialize()
  assert _names(process.initialize.type_signature.result.member) == [
      'global_parameters', 'distributor', 'aggregator', 'finalizer',
      'round_num',
  ]

  state, new_locals, metrics = process.next(state, _LOCALS, _DATA)

  np.testing.assert_allclose(state['global_parameters']['w'],
                             _GLOBAL['w'] + _MEAN, rtol=1e-6)
  assert state['round_num'] == 1
  # Round 0, first global entry 1.0: every user's state moves by 1.
  np.testing.assert_allclose(new_locals[0], [1.0, 11.0])
  np.testing.assert_allclose(new_locals[1], [6.0])
  # The loss over all examples, and the clients' metrics summed.
  assert metrics['train_loss'] == pytest.approx(5.0 / 3.0)
  assert metrics['num_examples'] == 3.0
  assert metrics['client_work']['loss_sum'] == pytest.approx(5.0)
  assert list(metrics) == ['train_loss', 'num_examples', 'client_work',
                           'aggregator', 'finalizer', 'distributor']

  # Round 1 starts from round 0's global parameters (first entry 1 + 8/3).
  _, again, _ = process.next(state, _LOCALS, _DATA)
  np.testing.assert_allclose(again[1], [5.0 + 1.0 + 1.0 + 8.0 / 3.0],
                             rtol=1e-6)


def _numpy_adam(x, gradients, learning_rate):
  """Adam from zero moments, one step per gradient (Kingma & Ba, Alg. 1)."""
  m = v = np.zeros_like(x, np.float64)
  x = x.astype(np.float64)
  for t, g in enumerate(gradients, start=1):
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    x = x - learning_rate * (m / (1 - 0.9**t)) / (
        np.sqrt(v / (1 - 0.999**t)) + 1e-8)
  return x


def test_server_adam_steps_on_the_aggregate_and_keeps_its_moments():
  params = collections.OrderedDict(dense=_GLOBAL)
  process = _process(
      finalizers.ServerAdam(params, learning_rate=0.1), params=params)
  state = process.initialize()
  for _ in range(3):
    state, _, _ = process.next(state, _LOCALS, _DATA)
  # The aggregate, <dense=<w=mean>>, is the gradient of every round.
  np.testing.assert_allclose(
      state['global_parameters']['dense']['w'],
      _numpy_adam(_GLOBAL['w'], [_MEAN] * 3, 0.1), rtol=1e-5)
  assert state['finalizer']['step'] == 3.0


def test_subtract_changes_moves_by_minus_the_aggregate():
  params = collections.OrderedDict(dense=_GLOBAL)
  process = _process(finalizers.SubtractChanges(), params=params)
  state, _, _ = process.next(process.initialize(), _LOCALS, _DATA)
  np.testing.assert_allclose(state['global_parameters']['dense']['w'],
                             _GLOBAL['w'] - _MEAN, rtol=1e-6)


def test_apply_delta_of_an_item_aggregate():
  table = np.arange(6, dtype=np.float32).reshape([3, 2])
  update = np.array([[1, 1], [0, 0], [5, 5]], np.float32)
  participants = np.array([2.0, 0.0, 1.0], np.float32)
  aggregate = collections.OrderedDict(item=collections.OrderedDict(
      update=update, participants=participants))

  @tff.federated_computation(
      tff.FederatedType(collections.OrderedDict(
          item_embedding=tff.TensorType(np.float32, [3, 2])), tff.SERVER),
      tff.FederatedType(tff.to_type(tf.nest.map_structure(
          lambda x: tff.TensorType(x.dtype, x.shape), aggregate)), tff.SERVER),
  )
  def apply(global_parameters, aggregate):
    results = {}
    for replaces in (False, True):
      _, new, _ = finalizers.ApplyDelta(
          replaces_trained_rows=replaces).finalize(
              tff.federated_value(collections.OrderedDict(), tff.SERVER),
              global_parameters, aggregate,
              tff.federated_value(np.int32(0), tff.SERVER))
      results[replaces] = new
    return tff.federated_zip(collections.OrderedDict(
        add=results[False], replace=results[True]))

  result = apply(collections.OrderedDict(item_embedding=table), aggregate)
  # Added: every row moves by its update; replaced: rows that somebody
  # trained (participants > 0) take the update, row 1 keeps its value.
  np.testing.assert_array_equal(result['add']['item_embedding'],
                                table + update)
  np.testing.assert_array_equal(result['replace']['item_embedding'],
                                [[1, 1], [2, 3], [5, 5]])


def test_ensemble_distillation_runs_after_the_inner_finalizer():
  rng = np.random.default_rng(0)
  tables = [rng.normal(size=(8, w)).astype(np.float32) for w in (2, 4)]
  params = collections.OrderedDict(item_tables=tables)
  zero_changes = lambda received, data: tf.nest.map_structure(
      tf.zeros_like, received['global_parameters'])
  options = dict(params=params, upload=zero_changes,
                 factory=keyed.KeyedFactory(collections.OrderedDict(
                     item_tables=tff.aggregators.SumFactory())))
  plain = _process(finalizers.SubtractChanges(), **options)
  distilled = _process(
      finalizers.WithEnsembleDistillation(
          finalizers.SubtractChanges(), num_items=3, learning_rate=0.01,
          seed=4),
      **options)
  data = [collections.OrderedDict(
      upload=np.zeros([1, 2], np.float32), loss=np.zeros([1], np.float32))]

  # The uploads are zero: without distillation nothing moves.
  plain_state, _, _ = plain.next(plain.initialize(), [np.zeros(1, np.float32)], data)
  state, _, metrics = distilled.next(distilled.initialize(), [np.zeros(1, np.float32)],
                                     data)

  for got, table in zip(plain_state['global_parameters']['item_tables'],
                        tables):
    np.testing.assert_array_equal(got, table)
  # Distillation on the 3 items the (seed, round) shuffle picks, as
  # `reskd.ensemble_distillation` does it alone.
  items = tf.random.experimental.stateless_shuffle(
      tf.range(8), seed=tf.constant([4, 0], tf.int64))[:3]
  want = reskd.ensemble_distillation(
      [tf.constant(t) for t in tables], items, learning_rate=0.01,
      step_rule='adam')
  for got, expected in zip(state['global_parameters']['item_tables'],
                           want.tables):
    np.testing.assert_allclose(got, expected, rtol=1e-6)
  np.testing.assert_allclose(
      metrics['finalizer']['distillation']['loss_before'],
      np.stack(want.loss_before), rtol=1e-6)


def _numpy_buffer_rounds(rounds, buffer_size, student_start):
  """APFR-GKD Eq. 6 with the toy uploads: aggregate a_t = g_{t-1} + mean,
  teacher = the mean of the last M aggregates, g_t = the teacher
  ('buffer_average') or a_t ('latest_aggregate')."""
  global_w, pushed = _GLOBAL['w'].astype(np.float64), []
  for _ in range(rounds):
    aggregate = global_w + _MEAN
    pushed = (pushed + [aggregate])[-buffer_size:]
    teacher = np.mean(pushed, axis=0)
    global_w = teacher if student_start == 'buffer_average' else aggregate
  return global_w, teacher


@pytest.mark.parametrize('student_start', finalizers.BUFFER_STUDENT_STARTS)
def test_buffered_global_model_averages_the_last_m_aggregates(student_start):
  process = _process(finalizers.BufferedGlobalModel(
      _GLOBAL, buffer_size=2, student_start=student_start))
  state = process.initialize()
  # theta_0 is not in the buffer: the teacher is theta_0 until a push.
  assert state['finalizer']['pushes'] == 0
  np.testing.assert_array_equal(state['finalizer']['teacher']['w'],
                                _GLOBAL['w'])
  for rounds in (1, 2, 3):
    state, _, metrics = process.next(state, _LOCALS, _DATA)
    want_global, want_teacher = _numpy_buffer_rounds(
        rounds, 2, student_start)
    np.testing.assert_allclose(state['global_parameters']['w'],
                               want_global, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(state['finalizer']['teacher']['w'],
                               want_teacher, rtol=1e-6, atol=1e-5)
    assert metrics['finalizer']['buffered'] == min(rounds, 2)
  # Round 3 averages rounds 2 and 3 only: with every aggregate kept the
  # teacher would differ.
  assert not np.allclose(_numpy_buffer_rounds(3, 3, student_start)[1],
                         want_teacher)


def test_teacher_broadcast_sends_the_buffer_average_once_there_is_one():
  initial = _initial(_GLOBAL)
  distributor = distributors.TeacherBroadcast()

  @tff.tensorflow.computation(
      distributor.received_type(initial.type_signature.result),
      tff.TensorType(np.float32, [None]), _DATA_TYPE,
  )
  def client_update(received, local, data):
    # Each user records has_teacher and the teacher's first entry.
    users = tf.cast(tf.shape(local)[0], tf.float32)
    new_local = (100.0 * received['has_teacher']
                 + received['teacher']['w'][0] + 0.0 * local)
    return new_local, collections.OrderedDict(
        update=_dense_mean_upload(received, data), weight=users,
        metrics=collections.OrderedDict(
            loss_sum=tf.reduce_sum(data['loss']), num_examples=users))

  work = composer.ClientWork(client_update)
  process = composer.compose_client_state_process(
      initial_global_parameters=initial,
      distributor=distributor,
      client_work=work,
      aggregator=keyed.KeyedFactory(collections.OrderedDict(
          dense=tff.aggregators.MeanFactory())).create(
              work.upload_type.update, tff.TensorType(np.float32)),
      finalizer=finalizers.BufferedGlobalModel(
          _GLOBAL, buffer_size=3, student_start='latest_aggregate'),
  )
  state, first, _ = process.next(process.initialize(), _LOCALS, _DATA)
  # Round 0: no teacher yet (has_teacher 0), theta_0 sent.
  np.testing.assert_allclose(first[1], [_GLOBAL['w'][0]])
  _, second, _ = process.next(state, _LOCALS, _DATA)
  # Round 1: the average of the one aggregate, theta_0 + mean.
  np.testing.assert_allclose(second[1],
                             [100.0 + _GLOBAL['w'][0] + _MEAN[0]], rtol=1e-6)
