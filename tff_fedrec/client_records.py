"""Where a `client_state_store.ClientStateStore` keeps its users' arrays:
in memory, or on disk in an SQLite database.

Both hold the same two kinds of per-user state (`client_state_store`):
stacked leaves of fixed shapes per partition (user u's are at position
`position[u]` of its partition), and ragged fields whose leading dimension
differs per user. The store asks them for a batch of users at a time:

  stacked(p, users, positions) -> [leaf [n, ...] per leaf of partition p]
  put_stacked(p, users, positions, leaves)
  ragged(name, users)          -> [array [T_u, ...] per user]
  put_ragged(name, users, values)
  column(name, users)          -> [n], one scalar per user
  put_column(name, users, values)
  nbytes()                      bytes of state held, every user's

Columns are the store's own bookkeeping beside the state (e.g. the round
a user last started from), one scalar per user.

`MemoryRecords` keeps numpy arrays (a partition's leaf stacked over its
users; until a leaf is first written, a read-only broadcast of the one
initial state every user starts from, so an untouched store costs nothing
per user). A checkpoint writes all of them (`to_arrays`).

`SqliteRecords` keeps them in an SQLite database (Python's own `sqlite3`;
docs/architecture.md says why this store and not LMDB, RocksDB or
memory-mapped arrays: measured by `benchmarks/store_backends.py`). One row
per user and table: `stacked(user, data)` holds the bytes of the user's
leaves one after the other, `ragged_<i>(user, data)` one ragged field's
bytes, `column_<i>(user, value)` one column's scalar; a user with no row
holds its initial state. Every write goes into
the open transaction; `commit(round)` ends it (WAL journal, fsynced:
`synchronous=FULL`) with the round it completes, so the database holds,
after a `kill -9` at any moment, a write included, the state of the last
round committed and nothing of a later one. A checkpoint is that commit:
the rows the rounds since the last one changed, never a copy of the
store. Reads see the open transaction's writes.

Example:
  >>> records = SqliteRecords.create('/tmp/run/client_states.sqlite', ...)
  >>> records.put_stacked(0, users, positions, leaves)
  >>> records.commit(3)
  >>> SqliteRecords.open(path, ...).committed_round()   # 3
"""

import collections
import json
import os
import sqlite3
import threading
from collections.abc import Mapping, Sequence

import numpy as np

from tff_fedrec import csr

# Users per SELECT ... IN (...): under SQLite's limit of host parameters.
_USERS_PER_QUERY = 500
_PAGE_BYTES = 16384


def layout(leaves: Sequence[np.ndarray]) -> list:
  """[(shape without the user dimension, dtype string)] of stacked leaves."""
  return [(list(leaf.shape[1:]), np.dtype(leaf.dtype).str) for leaf in leaves]


class MemoryRecords:
  """The users' arrays in memory (module docstring).

  Args:
    leaves: Per partition, its leaves stacked over its users [n_p, ...]
      (arrays or read-only broadcasts of one user's state).
    ragged: {name: per user, its array [T_u, ...]}.
  """

  def __init__(self, leaves: list[list[np.ndarray]],
               ragged: Mapping[str, list[np.ndarray]]):
    self._leaves = leaves
    self._ragged = collections.OrderedDict(ragged)
    self._columns = collections.OrderedDict()
    self._ragged_bytes = sum(value.nbytes for field in self._ragged.values()
                             for value in field)

  @property
  def partition_leaves(self) -> list[list[np.ndarray]]:
    """Per partition, its leaves stacked over its users (what
    `SqliteRecords.create` takes)."""
    return self._leaves

  def add_column(self, name: str, column: np.ndarray) -> None:
    """Adds column `name`, every user's value [U]."""
    self._columns[name] = column

  def commit(self, round_num: int) -> None:
    """Nothing: a checkpoint writes `to_arrays`."""
    del round_num

  def close(self) -> None:
    """Nothing to close."""

  def _own(self, partition: int, index: int) -> np.ndarray:
    """Leaf `index` of `partition` as an array of the store's own (a
    broadcast of the initial state becomes one on its first write)."""
    leaf = self._leaves[partition][index]
    if not leaf.flags.writeable:
      leaf = self._leaves[partition][index] = np.array(leaf)
    return leaf

  def stacked(self, partition, users, positions) -> list[np.ndarray]:
    del users
    return [leaf[positions] for leaf in self._leaves[partition]]

  def stacked_one(self, partition, user, position) -> list[np.ndarray]:
    del user
    return [leaf[position] for leaf in self._leaves[partition]]

  def put_stacked(self, partition, users, positions, leaves) -> None:
    del users
    for index, leaf in enumerate(leaves):
      self._own(partition, index)[positions] = leaf

  def ragged(self, name, users) -> list[np.ndarray]:
    field = self._ragged[name]
    return [field[user] for user in users]

  def put_ragged(self, name, users, values) -> None:
    field = self._ragged[name]
    for user, value in zip(users, values, strict=True):
      self._ragged_bytes += value.nbytes - field[user].nbytes
      field[user] = value

  def column(self, name, users) -> np.ndarray:
    return self._columns[name][users]

  def put_column(self, name, users, values) -> None:
    self._columns[name][users] = values

  def nbytes(self) -> int:
    return (sum(leaf.nbytes for leaves in self._leaves for leaf in leaves)
            + self._ragged_bytes)

  def to_arrays(self, *, copy: bool) -> collections.OrderedDict:
    ragged = collections.OrderedDict()
    for name, field in self._ragged.items():
      counts = np.array([len(value) for value in field], np.int64)
      ragged[name] = collections.OrderedDict(
          offsets=np.concatenate([[0], np.cumsum(counts)]),
          values=csr.ValuesInPieces(field),
      )
    leaves = []
    for partition, partition_leaves in enumerate(self._leaves):
      for index in range(len(partition_leaves)):
        leaf = self._own(partition, index)
        leaves.append(leaf.copy() if copy else leaf)
    columns = collections.OrderedDict(
        (name, column.copy()) for name, column in self._columns.items())
    return collections.OrderedDict(local_leaves=leaves, ragged=ragged,
                                   columns=columns)

  def load_arrays(self, arrays, num_users: int) -> None:
    columns = {name: np.asarray(arrays['columns'][name])
               for name in self._columns}
    for name, column in self._columns.items():
      found = columns[name]
      if found.shape != column.shape or found.dtype != column.dtype:
        raise ValueError(
            f'Checkpointed client states do not match this model: column '
            f'{name} {found.shape} {found.dtype} (expected {column.shape} '
            f'{column.dtype}).')
    leaves = [np.asarray(leaf) for leaf in arrays['local_leaves']]
    expected = [(leaf.shape, leaf.dtype)
                for partition in self._leaves for leaf in partition]
    found = [(leaf.shape, leaf.dtype) for leaf in leaves]
    if found != expected:
      raise ValueError(
          'Checkpointed client states do not match this model: local '
          f'state shapes and types {found} vs {expected}.'
      )
    # Into the store's own arrays: a copy beside them would double the
    # store's memory while the checkpoint loads.
    for name, column in self._columns.items():
      np.copyto(column, columns[name])
    for partition, partition_leaves in enumerate(self._leaves):
      for index in range(len(partition_leaves)):
        np.copyto(self._own(partition, index), leaves.pop(0), casting='no')
    for name, field in self._ragged.items():
      offsets = np.asarray(arrays['ragged'][name]['offsets'])
      values = np.asarray(arrays['ragged'][name]['values'], field[0].dtype)
      if offsets.shape != (num_users + 1,) or (
          values.shape[1:] != field[0].shape[1:]):
        raise ValueError(
            f'Checkpointed client states do not match this model: {name} '
            f'of {offsets.size - 1} users, rows {values.shape[1:]} (expected '
            f'{num_users} users, rows {field[0].shape[1:]}).'
        )
      self._ragged[name] = [
          values[offsets[u] : offsets[u + 1]].copy()
          for u in range(num_users)
      ]
    self._ragged_bytes = sum(value.nbytes for field in self._ragged.values()
                             for value in field)


class SqliteRecords:
  """The users' arrays in an SQLite database (module docstring). Made by
  `create` or `open`.

  Args (of both):
    path: The database file.
    partition_of: int64 [U], each user's partition.
    initial_leaves: Per partition, one user's leaves (the state a user
      without a row holds), or None where every user of the partition has
      a row (`create` with `rows`).
    layouts: Per partition, its leaves' `(shape, dtype)` without the user
      dimension.
    ragged: {name: the initial array [T, ...] every user starts with}.
    columns: {name: the initial scalar (a numpy scalar of the column's
      dtype) every user starts with}.
  """

  def __init__(self, path, partition_of, initial_leaves, layouts, ragged,
               columns):
    self._path = path
    self._partition_of = np.asarray(partition_of, np.int64)
    self._layouts = [[(tuple(shape), np.dtype(dtype)) for shape, dtype in lay]
                     for lay in layouts]
    self._record_bytes = [
        sum(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            for shape, dtype in layout) for layout in self._layouts]
    self._stacked_bytes = sum(
        int(np.count_nonzero(self._partition_of == p)) * size
        for p, size in enumerate(self._record_bytes))
    self._initial = [
        None if leaves is None
        else b''.join(np.ascontiguousarray(leaf, dtype).tobytes()
                      for leaf, (_, dtype) in zip(leaves, layout, strict=True))
        for leaves, layout in zip(initial_leaves, self._layouts, strict=True)]
    self._ragged_initial = collections.OrderedDict(
        (name, np.asarray(initial)) for name, initial in ragged.items())
    self._table = {name: f'ragged_{i}'
                   for i, name in enumerate(self._ragged_initial)}
    # Per field, each user's bytes (`open` reads those of the rows kept).
    self._ragged_bytes = {
        name: np.full(self._partition_of.size, initial.nbytes, np.int64)
        for name, initial in self._ragged_initial.items()}
    self._column_initial = collections.OrderedDict(
        (name, np.asarray(initial)) for name, initial in columns.items())
    self._column_table = {name: f'column_{i}'
                          for i, name in enumerate(self._column_initial)}
    self._lock = threading.Lock()
    self._db = sqlite3.connect(path, isolation_level=None,
                               check_same_thread=False)
    # A new database's pages (an existing one keeps its own): a user's
    # 26 KB of rows spill over fewer pages than the default 4 KB, which
    # read and wrote a batch 1.5x faster (benchmarks/store_backends.py,
    # --sqlite_page_size).
    self._db.execute(f'PRAGMA page_size={_PAGE_BYTES}')
    self._db.execute('PRAGMA journal_mode=WAL')
    self._db.execute('PRAGMA synchronous=FULL')
    # The WAL file shrinks back to this after each checkpoint of it.
    self._db.execute(f'PRAGMA journal_size_limit={64 << 20}')
    self._db.execute(f'PRAGMA cache_size=-{32 << 10}')

  def _layout_json(self) -> str:
    return json.dumps({
        'users': int(self._partition_of.size),
        'partitions': [[[list(s), d.str] for s, d in layout]
                       for layout in self._layouts],
        'ragged': [[name, list(initial.shape[1:]), initial.dtype.str]
                   for name, initial in self._ragged_initial.items()],
        'columns': [[name, initial.dtype.str]
                    for name, initial in self._column_initial.items()],
    })

  @classmethod
  def create(cls, path: str, partition_of, initial_leaves, layouts,
             ragged, columns, *, rows=None) -> 'SqliteRecords':
    """A new database at `path` (an existing file is replaced), its state
    committed as round 0. `rows`: optional [(partition, users int [n],
    leaves [n, ...] per leaf)] written as every user's initial stacked
    state (partitions whose users do not all start alike)."""
    for suffix in ('', '-wal', '-shm', '-journal'):
      if os.path.exists(path + suffix):
        os.remove(path + suffix)
    records = cls(path, partition_of, initial_leaves, layouts, ragged,
                  columns)
    records._db.execute('CREATE TABLE meta (key TEXT PRIMARY KEY, value)')
    records._db.execute(
        'CREATE TABLE stacked (user INTEGER PRIMARY KEY, data BLOB)')
    for table in records._table.values():
      records._db.execute(
          f'CREATE TABLE {table} (user INTEGER PRIMARY KEY, data BLOB)')
    for table in records._column_table.values():
      records._db.execute(
          f'CREATE TABLE {table} (user INTEGER PRIMARY KEY, value)')
    records._db.execute('BEGIN')
    records._db.execute("INSERT INTO meta VALUES ('layout', ?)",
                        (records._layout_json(),))
    records._db.execute("INSERT INTO meta VALUES ('round', 0)")
    for partition, users, leaves in rows or ():
      records.put_stacked(partition, users, None, leaves)
    records._db.execute('COMMIT')
    records._db.execute('BEGIN')
    return records

  @classmethod
  def open(cls, path: str, partition_of, initial_leaves, layouts,
           ragged, columns) -> 'SqliteRecords':
    """The database a run made at `path`, at its last committed round
    (what a killed process had not committed is gone)."""
    if not os.path.exists(path):
      raise FileNotFoundError(path)
    records = cls(path, partition_of, initial_leaves, layouts, ragged,
                  columns)
    found = records._db.execute(
        "SELECT value FROM meta WHERE key = 'layout'").fetchone()
    if found is None or found[0] != records._layout_json():
      raise ValueError(
          f'The client states in {path} do not match this model: layout '
          f'{found[0] if found else None} vs {records._layout_json()}.')
    for name, table in records._table.items():
      sizes = records._ragged_bytes[name]
      for user, size in records._db.execute(
          f'SELECT user, length(data) FROM {table}'):
        sizes[user] = size
    records._db.execute('BEGIN')
    return records

  @property
  def path(self) -> str:
    return self._path

  def committed_round(self) -> int:
    """The round the last commit completed (0: none yet)."""
    with self._lock:
      return int(self._db.execute(
          "SELECT value FROM meta WHERE key = 'round'").fetchone()[0])

  def commit(self, round_num: int) -> None:
    """Makes every write since the last commit durable, as the state after
    `round_num` rounds."""
    with self._lock:
      self._db.execute("UPDATE meta SET value = ? WHERE key = 'round'",
                       (int(round_num),))
      self._db.execute('COMMIT')
      self._db.execute('BEGIN')

  def close(self) -> None:
    """Closes the database; what was not committed is lost."""
    with self._lock:
      if self._db is not None:
        self._db.close()
        self._db = None

  def _select(self, table: str, users: np.ndarray,
              field: str = 'data') -> dict:
    found = {}
    users = np.asarray(users, np.int64).tolist()
    with self._lock:
      for start in range(0, len(users), _USERS_PER_QUERY):
        chunk = users[start : start + _USERS_PER_QUERY]
        marks = ','.join('?' * len(chunk))
        found.update(self._db.execute(
            f'SELECT user, {field} FROM {table} WHERE user IN ({marks})',
            chunk))
    return found

  def _write(self, table: str, users, values, field: str = 'data') -> None:
    with self._lock:
      self._db.executemany(
          f'INSERT OR REPLACE INTO {table} (user, {field}) VALUES (?, ?)',
          zip(np.asarray(users, np.int64).tolist(), values))

  def stacked(self, partition, users, positions) -> list[np.ndarray]:
    del positions
    users = np.asarray(users, np.int64)
    found = self._select('stacked', users)
    initial = self._initial[partition]
    blobs = [found.get(user, initial) for user in users.tolist()]
    if any(blob is None for blob in blobs):
      raise KeyError(f'Users without client state in {self._path}.')
    block = np.frombuffer(b''.join(blobs), np.uint8).reshape(
        users.size, self._record_bytes[partition])
    leaves, offset = [], 0
    for shape, dtype in self._layouts[partition]:
      size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
      leaves.append(np.ascontiguousarray(block[:, offset : offset + size])
                    .view(dtype).reshape(users.size, *shape))
      offset += size
    return leaves

  def stacked_one(self, partition, user, position) -> list[np.ndarray]:
    return [leaf[0] for leaf in self.stacked(partition, [user], [position])]

  def put_stacked(self, partition, users, positions, leaves) -> None:
    del positions
    users = np.asarray(users, np.int64)
    columns = [
        np.ascontiguousarray(leaf, dtype).reshape(users.size, -1)
        .view(np.uint8)
        for leaf, (_, dtype) in zip(leaves, self._layouts[partition],
                                    strict=True)]
    block = np.concatenate(columns, axis=1) if columns else np.zeros(
        [users.size, 0], np.uint8)
    self._write('stacked', users, (row.tobytes() for row in block))

  def ragged(self, name, users) -> list[np.ndarray]:
    users = np.asarray(users, np.int64)
    found = self._select(self._table[name], users)
    initial = self._ragged_initial[name]
    row_shape = initial.shape[1:]
    return [
        initial if user not in found else
        np.frombuffer(found[user], initial.dtype).reshape(-1, *row_shape)
        for user in users.tolist()]

  def put_ragged(self, name, users, values) -> None:
    users = np.asarray(users, np.int64)
    dtype = self._ragged_initial[name].dtype
    blobs = [np.ascontiguousarray(value, dtype).tobytes() for value in values]
    self._ragged_bytes[name][users] = [len(blob) for blob in blobs]
    self._write(self._table[name], users, blobs)

  def column(self, name, users) -> np.ndarray:
    users = np.asarray(users, np.int64)
    initial = self._column_initial[name]
    values = np.full(users.shape, initial, initial.dtype)
    found = self._select(self._column_table[name], users, 'value')
    if found:
      index = {user: i for i, user in enumerate(users.tolist())}
      for user, value in found.items():
        values[index[user]] = value
    return values

  def put_column(self, name, users, values) -> None:
    users = np.asarray(users, np.int64)
    values = np.broadcast_to(np.asarray(values), users.shape)
    self._write(self._column_table[name], users, values.tolist(), 'value')

  def nbytes(self) -> int:
    return self._stacked_bytes + sum(int(sizes.sum())
                         for sizes in self._ragged_bytes.values())

  def to_arrays(self, *, copy: bool) -> collections.OrderedDict:
    """Nothing: the database is its own checkpoint (`commit`)."""
    del copy
    return collections.OrderedDict(local_leaves=[],
                                   ragged=collections.OrderedDict(),
                                   columns=collections.OrderedDict())

  def load_arrays(self, arrays, num_users: int) -> None:
    del arrays, num_users
