"""Checkpoints as plain .npy files: a `tff.program.ProgramStateManager`.

TFF's `FileProgramStateManager` writes a SavedModel, first copying every
leaf into a `tf.Variable`. With client state of gigabytes that copy stays
resident: measured on Standalone's ML-1M store (4.1 GB), the program grew
from 4.8 GB to 9.0 GB after one save and to 13.0 GB after three, and neither
`gc.collect()` nor `malloc_trim` gave it back. This manager writes each leaf
of the (flattened) program state with `np.save` instead: no copy beyond the
file, and the files load without TensorFlow. A leaf that writes itself
(`write_npy(file)`, as `tff_fedrec.csr.ValuesInPieces` does) is written so,
not first made one array; `load` gives read-only memory maps of the files,
so a loaded state costs memory only for what its reader copies out of it
(the client-state store copies each user's part once; a full read made one
more copy of gigabytes of client state at every resume).

Layout: <root_dir>/program_state_<version>/<index>.npy, one file per leaf in
`tf.nest.flatten` order of the state, and format.json, the layout's format
(`FORMAT`): a checkpoint of another format is refused with a message saying
which version of tff_fedrec wrote it. A version is written to a temporary
directory and renamed into place, so a killed save never leaves a partial
version behind (the temporary name does not parse as a version). The
`keep_total` latest versions are kept. A version whose files do not read
back whole (truncated, emptied, removed) is passed over for the one before
it (`load_latest`).

Example:
  >>> manager = NumpyProgramStateManager('/tmp/run/checkpoints')
  >>> asyncio.run(manager.save({'round': 3, 'table': np.zeros([2, 2])}, 3))
  >>> asyncio.run(manager.load_latest({'round': 0, 'table': np.zeros([2, 2])}))
  ({'round': array(3), 'table': array(...)}, 3)
"""

import asyncio
import json
import os
import shutil
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

_PREFIX = 'program_state_'


class UnreadableCheckpointError(ValueError):
  """A checkpoint's files do not read back as this run's state."""

# 6: the store's per-user bookkeeping is columns of its own, and a store
# on disk (--client_store=disk) keeps its users' arrays in a database
# beside the checkpoints; 5: the store marks whose personal rows are whole (a user keeps only
# the rows it is scored by between its rounds); 4: the generic
# client-state store (stacked local state, ragged fields by name) and
# aggregates keyed by parameter name; 3: the client-state
# store keeps start tables (PFedRec's evaluation of untrained rows); 2: the
# one-program layout (composed processes, one training loop); 1 (no
# format.json).
FORMAT = 6
# The last commit that wrote each earlier format, and what it was.
_EARLIER_FORMATS = {
    1: ('19023d5', 'before processes were composed from roles'),
    2: ('7e1d56f', 'before the store kept the tables users started from'),
    3: ('4e13096', 'before the client-state store was generic'),
    4: ('cc6b66b', 'before the store marked whose personal rows are whole'),
    5: ('ce37e9b', 'before the client-state store kept columns and went on '
        'disk'),
}
_FORMAT_FILE = 'format.json'


class NumpyProgramStateManager(tff.program.ProgramStateManager):
  """Saves and loads program state as .npy files (module docstring)."""

  def __init__(self, root_dir: str, *, keep_total: int = 2):
    if keep_total < 1:
      raise ValueError(f'keep_total must be at least 1; got {keep_total}.')
    self._root_dir = root_dir
    self._keep_total = keep_total
    self.passed_over = []

  def _path(self, version: int) -> str:
    return os.path.join(self._root_dir, f'{_PREFIX}{version}')

  async def get_versions(self) -> Optional[list[int]]:
    if not os.path.isdir(self._root_dir):
      return None
    versions = []
    for name in os.listdir(self._root_dir):
      suffix = name[len(_PREFIX):]
      if name.startswith(_PREFIX) and suffix.isdigit():
        versions.append(int(suffix))
    return sorted(versions) or None

  async def load(self, version: int, structure):
    path = self._path(version)
    written = _read_format(path)
    if written != FORMAT:
      if written in _EARLIER_FORMATS:
        commit, what = _EARLIER_FORMATS[written]
        origin = (f'Format {written} was written up to commit {commit} '
                  f'({what}): resume or export that run with that version '
                  f'(git checkout {commit}), or')
      else:
        origin = 'Use the version of tff_fedrec that wrote it, or'
      raise ValueError(
          f'Checkpoint {path} has checkpoint format {written}; this version '
          f'of tff_fedrec reads format {FORMAT}. {origin} train it again in '
          'a new --root_dir.'
      )
    leaves = tf.nest.flatten(structure)
    files = [os.path.join(path, f'{index}.npy') for index in range(len(leaves))]
    found = len([n for n in os.listdir(path) if n.endswith('.npy')])
    if found != len(leaves):
      raise UnreadableCheckpointError(
          f'Checkpoint {path} holds {found} arrays, but this program keeps '
          f'{len(leaves)}.'
      )
    arrays = []
    for file in files:
      try:
        arrays.append(np.load(file, mmap_mode='r', allow_pickle=False))
      except (OSError, ValueError, EOFError) as error:
        raise UnreadableCheckpointError(
            f'{file} cannot be read ({error}).') from None
    return tf.nest.pack_sequence_as(structure, arrays)

  def check_readable(self) -> None:
    """Raises `UnreadableCheckpointError` (naming every problem) if there
    are checkpoints and none of them reads back; each one's arrays are read
    as `load` reads them, without the state's structure."""
    versions = asyncio.run(self.get_versions())
    if versions is None:
      return
    problems = []
    for version in reversed(versions):
      path = self._path(version)
      try:
        if _read_format(path) != FORMAT:
          return  # `load` explains the format itself.
        for name in sorted(os.listdir(path)):
          if name.endswith('.npy'):
            try:
              np.load(os.path.join(path, name), mmap_mode='r',
                      allow_pickle=False)
            except (OSError, ValueError, EOFError) as error:
              raise UnreadableCheckpointError(
                  f'{os.path.join(path, name)} cannot be read ({error}).'
              ) from None
        return
      except UnreadableCheckpointError as error:
        problems.append(str(error))
    raise UnreadableCheckpointError(self._no_checkpoint_message(problems))

  def _no_checkpoint_message(self, problems) -> str:
    return (
        f'No checkpoint in {self._root_dir} reads back: '
        + ' '.join(problems)
        + f' Delete {self._root_dir} to train the run again from round 0 '
        'with the same command, or give a new --root_dir.'
    )

  async def load_latest(self, structure):
    """The latest checkpoint that reads back whole; checkpoints that do not
    (a truncated or emptied file, a missing array) are passed over and
    named in `passed_over`. (None, 0) without any checkpoint.

    Raises:
      UnreadableCheckpointError: no checkpoint reads back; the message
        names each one's problem and how to start over.
    """
    self.passed_over = []
    versions = await self.get_versions()
    if versions is None:
      return None, 0
    for version in reversed(versions):
      try:
        return await self.load(version, structure), version
      except UnreadableCheckpointError as error:
        self.passed_over.append(str(error))
    raise UnreadableCheckpointError(
        self._no_checkpoint_message(self.passed_over))

  async def save(self, program_state, version: int) -> None:
    os.makedirs(self._root_dir, exist_ok=True)
    final = self._path(version)
    temporary = f'{final}_temporary'
    shutil.rmtree(temporary, ignore_errors=True)
    os.makedirs(temporary)
    for index, leaf in enumerate(tf.nest.flatten(program_state)):
      with open(os.path.join(temporary, f'{index}.npy'), 'wb') as f:
        if hasattr(leaf, 'write_npy'):
          leaf.write_npy(f)  # e.g. csr.ValuesInPieces: no copy of it made.
        else:
          np.save(f, np.asarray(leaf), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    with open(os.path.join(temporary, _FORMAT_FILE), 'w') as f:
      json.dump({'format': FORMAT}, f)
      f.flush()
      os.fsync(f.fileno())
    shutil.rmtree(final, ignore_errors=True)
    os.rename(temporary, final)
    for old in (await self.get_versions())[:-self._keep_total]:
      shutil.rmtree(self._path(old), ignore_errors=True)


def _read_format(path: str) -> int:
  """The format of the checkpoint at `path` (1 if it has no format.json)."""
  try:
    with open(os.path.join(path, _FORMAT_FILE)) as f:
      return int(json.load(f)['format'])
  except FileNotFoundError:
    return 1
  except (ValueError, KeyError, TypeError) as error:
    raise ValueError(
        f'Checkpoint {path} has an unreadable {_FORMAT_FILE} ({error}).'
    ) from None
