"""A split's per-user data on disk: made once, memory-mapped by every run
that asks for it again.

A million synthetic users take minutes to generate and split, and the
split's arrays (each user's training items, its evaluation candidates) are
gigabytes while they are made. A run stores what its split made as one
`.npy` file per array under the download cache (`splits/<key>/`, written
to a temporary folder and renamed into place, so a killed write leaves
nothing), and a later run of the same data and split settings maps them
read-only (`np.load(mmap_mode='r')`): its memory holds the pages the
rounds touch (the round's users' rows), not every user's. Nothing in a
split changes after it is made, so memory-mapped files need no journal:
the client state, which changes every round, is in
`client_records.SqliteRecords`.

What is cached: a split that is a flat dataclass of ints and numpy arrays
(`preprocessing.LeaveOneOutData`, `RandomSplitData`), with the
fingerprint of the interactions it was made from; id arrays of strings
are stored as fixed-width unicode and read back as Python strings. Other
splits are made every time. The key is a SHA-256 of the caller's
description of the data and the split settings.

Example:
  >>> data, fingerprint = cached_split(
  ...     {'dataset': 'synthetic', 'synthetic_users': 10**6, ...},
  ...     make=lambda: (split(load()), fingerprint(load())), cache_dir=None)
"""

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import uuid
from typing import Callable, Optional

import numpy as np

from tff_fedrec.tasks import movielens
from tff_fedrec.tasks import preprocessing

# Bump when the stored layout changes: older entries are then not found.
_FORMAT = 1
# Splits of fewer users are made each time (seconds at most), in memory.
CACHED_FROM_USERS = 100_000
_CACHED_TYPES = {cls.__name__: cls for cls in (
    preprocessing.LeaveOneOutData, preprocessing.RandomSplitData)}


def _directory(key: dict, cache_dir: Optional[str]) -> pathlib.Path:
  digest = hashlib.sha256(json.dumps(
      {**key, 'format': _FORMAT}, sort_keys=True).encode()).hexdigest()
  base = pathlib.Path(cache_dir) if cache_dir else movielens.default_cache_dir()
  return base / 'splits' / digest


def _load(directory: pathlib.Path):
  with open(directory / 'split.json') as file:
    manifest = json.load(file)
  cls = _CACHED_TYPES[manifest['type']]
  fields = dict(manifest['scalars'])
  for name in manifest['strings']:
    fields[name] = np.load(directory / f'{name}.npy').astype(object)
  for name in manifest['arrays']:
    fields[name] = np.load(directory / f'{name}.npy', mmap_mode='r')
  return cls(**fields), manifest['fingerprint']


def _save(directory: pathlib.Path, data, fingerprint: dict) -> None:
  temporary = directory.with_name(f'.{directory.name}.{uuid.uuid4().hex}')
  temporary.mkdir(parents=True)
  try:
    manifest = {'type': type(data).__name__, 'fingerprint': fingerprint,
                'scalars': {}, 'strings': [], 'arrays': []}
    for field in dataclasses.fields(data):
      value = getattr(data, field.name)
      if isinstance(value, (int, np.integer)):
        manifest['scalars'][field.name] = int(value)
      elif value.dtype == object:
        np.save(temporary / f'{field.name}.npy', value.astype(str),
                allow_pickle=False)
        manifest['strings'].append(field.name)
      else:
        np.save(temporary / f'{field.name}.npy', value, allow_pickle=False)
        manifest['arrays'].append(field.name)
    with open(temporary / 'split.json', 'w') as file:
      json.dump(manifest, file)
      file.flush()
      os.fsync(file.fileno())
    os.rename(temporary, directory)
  except OSError:
    shutil.rmtree(temporary, ignore_errors=True)
    if not directory.exists():
      raise


def cached_split(key: dict, make: Callable[[], tuple[object, dict]],
                 cache_dir: Optional[str] = None) -> tuple[object, dict]:
  """(split data, fingerprint of its interactions): from the cache when it
  holds `key`'s (its arrays memory-mapped), else `make()`'s, stored for
  the next run when it is a split the cache keeps. An entry that does not
  read back is made again."""
  directory = _directory(key, cache_dir)
  if directory.exists():
    try:
      return _load(directory)
    except (OSError, ValueError, KeyError, TypeError):
      shutil.rmtree(directory, ignore_errors=True)
  data, fingerprint = make()
  if type(data).__name__ in _CACHED_TYPES and all(
      isinstance(getattr(data, f.name), (int, np.integer, np.ndarray))
      for f in dataclasses.fields(data)):
    try:
      _save(directory, data, fingerprint)
    except OSError:
      pass  # A cache that cannot be written costs the next run the split.
  return data, fingerprint
