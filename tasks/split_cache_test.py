"""The split cache: made once, memory-mapped after, keyed by what made it;
an entry that does not read back is made again."""

import dataclasses
import os

import numpy as np
import pandas as pd

from tff_fedrec.tasks import preprocessing
from tff_fedrec.tasks import split_cache


def _split(seed=0):
  rows = [(f'u{u}', f'i{(u * 5 + k) % 50}', 5.0, float(k))
          for u in range(12) for k in range(6)]
  return preprocessing.leave_one_out_split(
      preprocessing.index_interactions(pd.DataFrame(
          rows, columns=['user', 'item', 'rating', 'timestamp'])),
      num_eval_negatives=5, seed=seed)


def _assert_same(got, expected):
  assert type(got) is type(expected)
  for field in dataclasses.fields(expected):
    mine, theirs = getattr(got, field.name), getattr(expected, field.name)
    if isinstance(theirs, np.ndarray):
      assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
      assert mine.tolist() == theirs.tolist()
    else:
      assert mine == theirs


def test_a_split_is_made_once_then_mapped_from_the_cache(tmp_path):
  made = []

  def make():
    made.append(1)
    return _split(), {'sha256': 'abc'}

  first, fingerprint = split_cache.cached_split({'data': 1}, make, tmp_path)
  second, again = split_cache.cached_split({'data': 1}, make, tmp_path)
  assert len(made) == 1 and fingerprint == again == {'sha256': 'abc'}
  _assert_same(second, first)
  # Mapped read-only, not read into memory; the ids are Python strings.
  assert isinstance(second.train_items, np.memmap)
  assert not second.val_negatives.flags.writeable
  assert isinstance(second.user_ids[0], str)
  # Another key is another split.
  split_cache.cached_split({'data': 2}, make, tmp_path)
  assert len(made) == 2


def test_an_entry_that_does_not_read_back_is_made_again(tmp_path):
  split_cache.cached_split({'k': 1}, lambda: (_split(), {}), tmp_path)
  (entry,) = (tmp_path / 'splits').iterdir()
  os.remove(entry / 'train_items.npy')
  made = []

  def make():
    made.append(1)
    return _split(), {}

  data, _ = split_cache.cached_split({'k': 1}, make, tmp_path)
  assert made == [1]
  _assert_same(data, _split())
  _assert_same(split_cache.cached_split({'k': 1}, make, tmp_path)[0],
               _split())
  assert made == [1]


def test_splits_it_does_not_keep_are_made_each_time(tmp_path):
  made = []

  def make():
    made.append(1)
    return {'not': 'a split'}, {}

  for _ in range(2):
    assert split_cache.cached_split({'k': 1}, make, tmp_path)[0] == {
        'not': 'a split'}
  assert made == [1, 1]
  assert not (tmp_path / 'splits').exists() or not any(
      (tmp_path / 'splits').iterdir())
