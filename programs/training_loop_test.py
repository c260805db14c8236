import collections

import numpy as np
import pandas as pd
import pytest

from tff_fedrec.programs import training_loop
from tff_fedrec.tasks import preprocessing


def _data(num_users=6, num_items=40, per_user=6):
  rows = [
      (f'u{u}', f'i{(u * 7 + k) % num_items}', 5.0, float(k))
      for u in range(num_users)
      for k in range(per_user)
  ]
  frame = pd.DataFrame(rows, columns=['user', 'item', 'rating', 'timestamp'])
  indexed = preprocessing.index_interactions(frame)
  return preprocessing.leave_one_out_split(
      indexed, num_eval_negatives=5, seed=0
  )


def test_best_round_takes_the_latest_of_equal_validation_hr():
  # The reference code updates the best round when val_hr >= best so far.
  history = {'val_hr@10': [0.1, 0.5, 0.3, 0.5, 0.2]}
  assert training_loop.best_round(history) == 3


def test_sample_round_is_a_function_of_seed_and_round():
  data = _data()
  config = training_loop.LoopConfig(rounds=3, clients_per_round=4, seed=5)
  users_a, data_a, _ = training_loop.sample_round(data, config, 1)
  users_b, data_b, _ = training_loop.sample_round(data, config, 1)
  users_c, data_c, _ = training_loop.sample_round(data, config, 2)
  np.testing.assert_array_equal(users_a, users_b)
  for a, b in zip(data_a, data_b):
    np.testing.assert_array_equal(a['items'], b['items'])
  assert len(users_a) == 4 and np.all(np.diff(users_a) > 0)
  assert not all(
      np.array_equal(a['items'], c['items']) for a, c in zip(data_a, data_c)
  ) or not np.array_equal(users_a, users_c)


def test_sample_round_gives_each_user_its_positives_and_four_negatives():
  data = _data()
  config = training_loop.LoopConfig(rounds=1, clients_per_round=100, seed=0)
  users, client_data, examples = training_loop.sample_round(data, config, 0)
  np.testing.assert_array_equal(users, np.arange(data.num_users))
  for user, example in zip(users, client_data):
    positives = data.train_items[
        data.train_offsets[user] : data.train_offsets[user + 1]
    ]
    interacted = data.interacted_items[
        data.interacted_offsets[user] : data.interacted_offsets[user + 1]
    ]
    labels = example['labels']
    assert labels.sum() == positives.size
    assert labels.size == 5 * positives.size
    assert sorted(example['items'][labels == 1]) == sorted(positives)
    assert not np.isin(example['items'][labels == 0], interacted).any()
    assert example['items'].dtype == np.int32
    assert example['seed'].shape == (2,)
    # The client data is the user's segment of the round's examples.
    np.testing.assert_array_equal(
        example['items'],
        examples.items[examples.offsets[user]:examples.offsets[user + 1]],
    )


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
