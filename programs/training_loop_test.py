import collections
import types

import numpy as np
import pytest

from tff_fedrec import client_state_store
from tff_fedrec.algorithms import method as method_lib
from tff_fedrec.programs import training_loop


def test_a_finite_round_passes_the_divergence_check():
  state = {'parameters': [np.ones([2, 3], np.float32)],
           'round_num': np.int32(4), 'name': np.asarray(b'x')}
  training_loop.raise_if_diverged(3, 0.5, state, last_saved_round=3)


@pytest.mark.parametrize('loss, bad_value, expected', [
    (float('nan'), 1.0, 'the training loss is nan'),
    (0.5, np.inf, 'the server state has non-finite values'),
    (0.5, np.nan, 'the server state has non-finite values'),
])
def test_a_non_finite_round_stops_naming_the_round_and_the_checkpoint(
    loss, bad_value, expected
):
  table = np.ones([2, 3], np.float32)
  table[1, 2] = bad_value
  state = collections.OrderedDict(
      parameters=[np.zeros([4], np.float32), [table]],
      round_num=np.int32(7),
  )
  with pytest.raises(training_loop.TrainingDivergedError) as error:
    training_loop.raise_if_diverged(6, loss, state, last_saved_round=5)
  message = str(error.value)
  assert 'training diverged at round 7' in message
  assert expected in message
  assert 'the last checkpoint holds round 5' in message
  assert '--learning_rate' in message


def test_run_peak_rss_keeps_the_largest_peak_of_every_process(tmp_path):
  own_peak = training_loop.peak_rss_mb(None)
  assert own_peak > 0
  # The first process of a run: its own peak, now on disk.
  first = training_loop.run_peak_rss_mb(str(tmp_path), None)
  assert first >= own_peak
  peak_file = tmp_path / training_loop.PEAK_RSS_FILE
  assert float(peak_file.read_text()) == pytest.approx(first, abs=0.1)
  # An earlier process of the run peaked higher: that peak is the run's.
  peak_file.write_text(f'{100 * own_peak:.1f}\n')
  assert training_loop.run_peak_rss_mb(str(tmp_path), None) == pytest.approx(
      100 * own_peak, abs=0.1
  )
  # A file it cannot read is replaced by this process's peak.
  peak_file.write_text('not a number')
  assert training_loop.run_peak_rss_mb(str(tmp_path), None) < 100 * own_peak
  assert float(peak_file.read_text()) > 0


def test_scalar_fields_flatten_one_level_for_the_csv():
  row = {'round': 3, 'train_loss': 0.5, 'test': {'recall@20': 0.25,
         'per_tier': {'small': {}}}, 'name': 'x'}
  fields = training_loop.scalar_fields(row)
  assert list(fields) == ['train_loss', 'test_recall_at_20']
  assert fields['test_recall_at_20'] == 0.25


def test_loop_config_refuses_zero():
  with pytest.raises(ValueError, match='checkpoint_every must be at least 1'):
    training_loop.LoopConfig(rounds=2, checkpoint_every=0)


class _PlannedRounds:
  """A protocol's draws of users, by hand; counts the draws asked for."""

  def __init__(self, rounds):
    self.rounds = rounds
    self.asked = []

  def round_users(self, round_num):
    self.asked.append(round_num)
    return np.array(self.rounds[round_num])


def test_last_rounds_are_each_users_latest_round_in_the_range():
  protocol = _PlannedRounds([[0, 1], [1, 2], [0, 2], [2], [0]])
  np.testing.assert_array_equal(
      training_loop.last_rounds(protocol, range(5), num_users=4),
      [4, 1, 3, -1])
  # From round 2 on (a resumed run), user 1 trains no more.
  np.testing.assert_array_equal(
      training_loop.last_rounds(protocol, range(2, 5), num_users=4),
      [4, -1, 3, -1])
  # Every user seen: the earlier rounds are not drawn.
  protocol.asked.clear()
  np.testing.assert_array_equal(
      training_loop.last_rounds(protocol, range(5), num_users=3), [4, 1, 3])
  assert protocol.asked == [4, 3, 2, 1]


class _PlannedProtocol(_PlannedRounds):
  data = types.SimpleNamespace(num_users=3)

  def round_input(self, round_num):
    return method_lib.RoundInput(round_num, np.array(self.rounds[round_num]),
                                 [], None, 0)


def test_round_inputs_mark_the_users_training_their_last_round(tmp_path):
  run = training_loop.TrainingRun(
      types.SimpleNamespace(initial_store=lambda: None),
      _PlannedProtocol([[0, 1], [1, 2], [0, 2], [2]]),
      training_loop.LoopConfig(rounds=4), str(tmp_path), log=lambda _: None)
  marks = [run.round_input(r).last_round_users.tolist() for r in range(4)]
  assert marks == [[False, False], [True, False], [True, False], [True]]


class _CohortRecordingMethod:
  """Records the cohort size each round is given."""

  process = types.SimpleNamespace(initialize=lambda: np.float32(0))

  def __init__(self, state_floats_per_user):
    self.cohort_sizes = []
    self._initial = np.zeros([state_floats_per_user], np.float32)

  def initial_store(self):
    return client_state_store.ClientStateStore(10, {'table': self._initial})

  def run_round(self, server_state, store, round_input, *, users_per_client,
                cohort_size):
    del store, round_input, users_per_client
    self.cohort_sizes.append(cohort_size)
    return method_lib.RoundResult(server_state, {'train_loss': 0.5})


@pytest.mark.parametrize('floats_per_user, budget, expected', [
    (1000, 100 * 4000, 64),  # 100 users' state fit: 64 of them train.
    (10, 100 * 4000, 256),   # Small states: --cohort_size as given.
    (1000, None, 256),       # No budget.
])
def test_rounds_get_the_cohort_size_the_state_budget_allows(
    tmp_path, floats_per_user, budget, expected):
  method = _CohortRecordingMethod(floats_per_user)
  run = training_loop.TrainingRun(
      method, _PlannedProtocol([[0, 1], [1, 2]]),
      training_loop.LoopConfig(rounds=2, eval_every=2, cohort_size=256,
                               cohort_state_bytes=budget),
      str(tmp_path), log=lambda _: None)
  run.server_state = np.float32(0)
  run.run_round(0)
  assert method.cohort_sizes == [expected]


def test_a_reader_of_a_run_on_disk_without_states_yet_creates_none(tmp_path):
  def run(root_dir):
    return training_loop.TrainingRun(
        _CohortRecordingMethod(4), _PlannedProtocol([[0, 1]]),
        training_loop.LoopConfig(rounds=1, client_store='disk'),
        str(root_dir), log=lambda _: None)
  reader = run(tmp_path / 'read')
  reader.restore_or_initialize(create_client_states=False)
  assert reader.next_round == 0 and not reader.store.on_disk
  assert not (tmp_path / 'read' / 'checkpoints').exists()
  trainer = run(tmp_path / 'train')
  trainer.restore_or_initialize()
  assert trainer.store.on_disk
  assert (tmp_path / 'train' / 'checkpoints' / 'client_states.sqlite').exists()
  trainer.store.close()
