"""APFR-GKD's buffer of global models and its teacher broadcast, on the toy
process (`templates.toy_process`), against numpy (Eq. 6)."""

import numpy as np
import pytest

from tff_fedrec.algorithms.apfr_gkd import global_buffer
from tff_fedrec.programs import execution
from tff_fedrec.templates import toy_process


@pytest.fixture(scope='module', autouse=True)
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


def _numpy_buffer_rounds(rounds, buffer_size, student_start):
  """APFR-GKD Eq. 6 with the toy uploads: aggregate a_t = g_{t-1} + mean,
  teacher = the mean of the last M aggregates, g_t = the teacher
  ('buffer_average') or a_t ('latest_aggregate')."""
  global_w, pushed = toy_process.GLOBAL['w'].astype(np.float64), []
  for _ in range(rounds):
    aggregate = global_w + toy_process.MEAN
    pushed = (pushed + [aggregate])[-buffer_size:]
    teacher = np.mean(pushed, axis=0)
    global_w = teacher if student_start == 'buffer_average' else aggregate
  return global_w, teacher


@pytest.mark.parametrize('student_start',
                         global_buffer.BUFFER_STUDENT_STARTS)
def test_buffered_global_model_averages_the_last_m_aggregates(student_start):
  process = toy_process.build(global_buffer.BufferedGlobalModel(
      toy_process.GLOBAL, buffer_size=2, student_start=student_start))
  state = process.initialize()
  # theta_0 is not in the buffer: the teacher is theta_0 until a push.
  assert state['finalizer']['pushes'] == 0
  np.testing.assert_array_equal(state['finalizer']['teacher']['w'],
                                toy_process.GLOBAL['w'])
  for rounds in (1, 2, 3):
    state, _, metrics = process.next(
        state, toy_process.LOCALS, toy_process.DATA)
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
  # Each user records has_teacher and the teacher's first entry.
  process = toy_process.build(
      global_buffer.BufferedGlobalModel(
          toy_process.GLOBAL, buffer_size=3,
          student_start='latest_aggregate'),
      distributor=global_buffer.TeacherBroadcast(),
      new_local=lambda received, local: (
          100.0 * received['has_teacher'] + received['teacher']['w'][0]
          + 0.0 * local),
  )
  state, first, _ = process.next(
      process.initialize(), toy_process.LOCALS, toy_process.DATA)
  # Round 0: no teacher yet (has_teacher 0), theta_0 sent.
  np.testing.assert_allclose(first[1], [toy_process.GLOBAL['w'][0]])
  _, second, _ = process.next(state, toy_process.LOCALS, toy_process.DATA)
  # Round 1: the average of the one aggregate, theta_0 + mean.
  np.testing.assert_allclose(
      second[1],
      [100.0 + toy_process.GLOBAL['w'][0] + toy_process.MEAN[0]], rtol=1e-6)
