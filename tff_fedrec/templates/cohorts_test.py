"""`cohorts`: a round in cohorts is the round, against numpy."""

import collections
import threading

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec.programs import execution
from tff_fedrec.templates import cohorts
from tff_fedrec.templates import two_phase

_STATE = tff.FederatedType(np.float32, tff.SERVER)
_ON_CLIENTS = tff.FederatedType(np.float32, tff.CLIENTS)
_UPLOAD = collections.OrderedDict(value=np.float32, weight=np.float32)


@tff.tensorflow.computation(np.float32, np.float32, np.float32)
def _client_update(server_value, local, data):
  return local + data, collections.OrderedDict(
      value=server_value * data + local, weight=data)


@tff.federated_computation
def _initialize():
  return tff.federated_eval(tff.tensorflow.computation(
      lambda: tf.constant(1.0)), tff.SERVER)


@tff.federated_computation(_STATE, _ON_CLIENTS, _ON_CLIENTS)
def _client_step(state, locals_, data):
  return tff.federated_map(
      _client_update, (tff.federated_broadcast(state), locals_, data))


_MEAN = tff.aggregators.MeanFactory().create(
    tff.TensorType(np.float32), tff.TensorType(np.float32))


@tff.tensorflow.computation(np.float32, np.float32)
def _add(state, mean):
  return state + mean


@tff.federated_computation(
    _STATE, tff.FederatedType(_UPLOAD, tff.CLIENTS))
def _server_step(state, uploads):
  # A weighted mean through TFF's own aggregation factory (its
  # accumulate / merge / report), and a plain sum beside it.
  mean = _MEAN.next(_MEAN.initialize(), uploads.value, uploads.weight).result
  total_weight = tff.federated_sum(uploads.weight)
  return tff.federated_map(_add, (state, mean)), total_weight


_PROCESS = two_phase.TwoPhaseProcess(_initialize, _client_step, _server_step)


def _reference(state, locals_, data):
  """numpy: new locals, new state, metrics."""
  locals_, data = np.asarray(locals_), np.asarray(data)
  values = state * data + locals_
  mean = np.sum(values * data) / np.sum(data)
  return locals_ + data, state + mean, np.sum(data)


@pytest.mark.parametrize('sizes', [[7], [3, 3, 1], [1] * 7])
def test_a_round_in_cohorts_is_the_round(sizes):
  rng = np.random.default_rng(0)
  locals_ = list(rng.normal(size=7).astype(np.float32))
  data = list(rng.uniform(0.5, 2.0, size=7).astype(np.float32))
  starts = np.cumsum([0, *sizes])
  stored = {}

  def put_results(index, cohort_data, new_locals):
    assert index not in stored
    np.testing.assert_array_equal(
        cohort_data, data[starts[index]:starts[index + 1]])
    stored[index] = new_locals

  with execution.worker_execution_context():
    state, metrics = cohorts.run_round(
        _PROCESS, np.float32(0.5),
        ((locals_[a:b], data[a:b]) for a, b in zip(starts, starts[1:])),
        put_results,
    )
  want_locals, want_state, want_metrics = _reference(0.5, locals_, data)
  assert sorted(stored) == list(range(len(sizes)))
  np.testing.assert_allclose(
      np.concatenate([stored[i] for i in range(len(sizes))]), want_locals,
      rtol=1e-6)
  assert state == pytest.approx(want_state, rel=1e-6)
  assert metrics == pytest.approx(want_metrics, rel=1e-6)


@tff.tensorflow.computation(np.float32, np.float32)
def _times(value, factor):
  return value * factor


@tff.federated_computation(_STATE, tff.FederatedType(_UPLOAD, tff.CLIENTS))
def _dependent_server_step(state, uploads):
  # The second aggregation needs the first one's result on the clients:
  # nothing to accumulate cohort by cohort.
  total = tff.federated_sum(uploads.value)
  scaled = tff.federated_map(
      _times, (uploads.weight, tff.federated_broadcast(total)))
  return state, tff.federated_sum(scaled)


def test_a_server_step_with_dependent_aggregations_is_refused_clearly():
  process = two_phase.TwoPhaseProcess(
      _initialize, _client_step, _dependent_server_step)
  with pytest.raises(cohorts.CohortsUnsupportedError, match='--cohort_size'):
    cohorts.cohort_round(process)


def _cohorts(sizes, seed=0):
  rng = np.random.default_rng(seed)
  locals_ = list(rng.normal(size=sum(sizes)).astype(np.float32))
  data = list(rng.uniform(0.5, 2.0, size=sum(sizes)).astype(np.float32))
  starts = np.cumsum([0, *sizes])
  return [(locals_[a:b], data[a:b]) for a, b in zip(starts, starts[1:])]


@pytest.mark.parametrize('sizes', [[3, 3, 1], [1] * 7, [2] * 5])
def test_two_lanes_give_one_lane_s_round_to_the_bit(sizes):
  """Cohorts are stored in order, from the calling thread, and merged in
  order: the same state and client states as one lane, bit for bit."""
  cohort_list = _cohorts(sizes)
  runs = {}
  with execution.worker_execution_context():
    for lanes in (1, 2):
      stored, threads = [], set()

      def put_results(index, cohort_data, new_locals, stored=stored,
                      threads=threads):
        threads.add(threading.get_ident())
        stored.append((index, np.asarray(new_locals)))

      state, metrics = cohorts.run_round(
          _PROCESS, np.float32(0.5), iter(cohort_list), put_results,
          lanes=lanes)
      assert [index for index, _ in stored] == list(range(len(sizes)))
      assert threads == {threading.get_ident()}
      runs[lanes] = (state, metrics, np.concatenate([s for _, s in stored]))
  np.testing.assert_array_equal(runs[1][2], runs[2][2])
  assert runs[1][0] == runs[2][0] and runs[1][1] == runs[2][1]


def test_a_cohort_s_error_is_raised_and_no_later_cohort_is_stored():
  cohort_list = _cohorts([2] * 6)
  # The fourth cohort's data is not float32: its step fails in either lane.
  cohort_list[3] = (cohort_list[3][0], [np.array('x'), np.array('y')])
  stored = []
  with execution.worker_execution_context():
    with pytest.raises(TypeError, match='Failed to serialize'):
      cohorts.run_round(
          _PROCESS, np.float32(0.5), iter(cohort_list),
          lambda index, *_: stored.append(index), lanes=2)
  assert stored == list(range(len(stored))) and len(stored) <= 3


def test_two_lanes_need_a_context_that_allows_them():
  with pytest.raises(ValueError, match='allows one lane'):
    cohorts.run_round(_PROCESS, np.float32(0.5), iter(_cohorts([1])),
                      lambda *_: None, lanes=2)


@pytest.mark.parametrize('size, per_user, budget, expected', [
    (256, 55_000, 64 << 20, 256),     # PFedRec ML-1M's users fit.
    (256, 474_500, 64 << 20, 128),    # FedRAS ML-1M: 141 fit, 128 taken.
    (256, 3_000_000, 64 << 20, 32),   # 22 fit: no fewer than 32.
    (16, 3_000_000, 64 << 20, 16),    # Never more than asked for.
    (256, 474_500, None, 256),        # No bound.
    (256, 474_500, 0, 256),
    (None, 474_500, 64 << 20, None),  # Every user at once stays so.
    (256, 0.0, 64 << 20, 256),        # No state yet.
])
def test_the_cohort_shrinks_to_a_power_of_two_whose_state_fits(
    size, per_user, budget, expected):
  assert cohorts.bounded_cohort_size(size, per_user, budget) == expected
