import numpy as np
import pandas as pd
import pytest

from tff_fedrec.tasks import datasets
from tff_fedrec.tasks import errors


def _write_ratings(path, num_users=4, per_user=6, num_items=250):
  lines = [
      f'{u}::{(u * 13 + k) % num_items}::4::{1000 + k}'
      for u in range(num_users)
      for k in range(per_user)
  ]
  # Ten filler users with 25 items each make every item exist while leaving
  # each filler user the 2 x 99 never-interacted items evaluation needs.
  lines += [f'f{i // 25}::{i}::1::{i}' for i in range(num_items)]
  path.write_text('\n'.join(lines) + '\n')


def test_local_file_is_split_leave_one_out_with_disjoint_negatives(tmp_path):
  path = tmp_path / 'ratings.dat'
  _write_ratings(path)
  data = datasets.load_leave_one_out(
      datasets.DataConfig(dataset='file', data_path=str(path), separator='::')
  )
  assert data.num_users == 14
  # Users 0..3 keep 6 - 2 training positives each, the fillers 25 - 2.
  assert list(np.diff(data.train_offsets)) == [4] * 4 + [23] * 10
  assert data.val_negatives.shape == data.test_negatives.shape == (14, 99)
  for user in range(data.num_users):
    assert not set(data.val_negatives[user]) & set(data.test_negatives[user])


def test_min_interactions_drops_small_users(tmp_path):
  path = tmp_path / 'ratings.dat'
  _write_ratings(path, per_user=3)
  config = datasets.DataConfig(
      dataset='file', data_path=str(path), separator='::',
      min_interactions_per_user=10,
  )
  assert datasets.load_leave_one_out(config).num_users == 10


def test_synthetic_data_is_seeded():
  config = datasets.DataConfig(
      dataset='synthetic', synthetic_users=30, synthetic_items=300, seed=3
  )
  first = datasets.load_leave_one_out(config, num_eval_negatives=10)
  second = datasets.load_leave_one_out(config, num_eval_negatives=10)
  np.testing.assert_array_equal(first.train_items, second.train_items)
  np.testing.assert_array_equal(first.test_negatives, second.test_negatives)


def test_file_dataset_without_path_and_unknown_dataset_are_errors(tmp_path):
  with pytest.raises(ValueError, match='--data_path'):
    datasets.load_interactions(datasets.DataConfig(dataset='file'))
  with pytest.raises(ValueError, match='nosuch'):
    datasets.load_interactions(datasets.DataConfig(dataset='nosuch'))
  with pytest.raises(errors.DataFormatError, match='missing.csv'):
    datasets.load_interactions(
        datasets.DataConfig(
            dataset='file', data_path=str(tmp_path / 'missing.csv')
        )
    )


def test_separator_applies_to_a_local_movielens_copy(tmp_path):
  # A local ML-100K copy with '::' fields (ML-1M's own format).
  path = tmp_path / 'ml.dat'
  path.write_text(''.join(
      f'{user}::{item}::1::{t}\n'
      for t, (user, item) in enumerate(
          (u, i) for u in range(3) for i in range(4))))
  frame = datasets.load_interactions(datasets.DataConfig(
      dataset='ml-100k', data_path=str(path), separator='::'))
  assert len(frame) == 12 and set(frame['user']) == {'0', '1', '2'}
  # Without it, MovieLens' tab applies and the file is refused by name.
  with pytest.raises(errors.DataFormatError, match='ml.dat'):
    datasets.load_interactions(datasets.DataConfig(
        dataset='ml-100k', data_path=str(path)))


def _frame(rows):
  return pd.DataFrame({
      'user': pd.Series([r[0] for r in rows], dtype=object),
      'item': pd.Series([r[1] for r in rows], dtype=object),
      'rating': np.array([r[2] for r in rows], np.float64),
      'timestamp': np.array([r[3] for r in rows], np.float64),
  })


def test_fingerprint_counts_and_changes_with_any_field():
  rows = [('u1', 'i1', 4.0, 1.0), ('u1', 'i2', 3.0, 2.0),
          ('u2', 'i1', 5.0, 3.0)]
  base = datasets.fingerprint(_frame(rows))
  assert {k: base[k] for k in ('interactions', 'users', 'items')} == {
      'interactions': 3, 'users': 2, 'items': 2}
  assert datasets.fingerprint(_frame(list(rows))) == base
  changed = [
      rows + [('u3', 'i1', 1.0, 4.0)],  # a row appended
      [('u1 ', 'i1', 4.0, 1.0), *rows[1:]],  # a space in an id
      [('u1', 'i1', 4.5, 1.0), *rows[1:]],  # a rating
      [('u1', 'i1', 4.0, 1.5), *rows[1:]],  # a timestamp
      [rows[1], rows[0], rows[2]],  # the order
      # Joined ids that would read the same without separators.
      [('u1i', '1', 4.0, 1.0), *rows[1:]],
  ]
  prints = [datasets.fingerprint(_frame(r))['sha256'] for r in changed]
  assert base['sha256'] not in prints
  assert len(set(prints)) == len(prints)
