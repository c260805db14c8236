r"""Benchmark: batch random reads and writes of per-user records on the
embedded stores a client-state store could live in (issue 43).

A round reads the client states of its clients (a random batch of users
out of all of them), trains, and writes their new states back in one
transaction that a `kill -9` either keeps whole or loses whole. This times
exactly that, on U users' records of B bytes each:

  sqlite   Python's own `sqlite3`, one table (user INTEGER PRIMARY KEY,
           state BLOB), WAL journal, synchronous=FULL (as the store), one
           transaction per batch written;
  lmdb     the `lmdb` binding (if installed), one key per user, one write
           transaction per batch;
  rocksdb  the `rocksdict` binding (if installed), a WriteBatch per batch;
  memmap   fixed-size records in a memory-mapped file, crash safety by a
           redo journal: the batch's records appended to a journal and
           fsynced, then copied into the map and flushed (fixed-size
           records only: ragged state, e.g. a user's fine-tuned rows,
           needs an allocator on top).

  python benchmarks/store_backends.py --users=1000000 --record_bytes=2048 \
      --batch=10000 --dir=/tmp/store_bench

Prints, per store: seconds to build the U records, and median seconds to
read a batch of random users and to write it (commit included), with the
process's peak RSS after each (the stores' page caches count; the memmap's
touched pages count too, as file-backed resident pages).
"""

import argparse
import os
import shutil
import sqlite3
import statistics
import time

import numpy as np


def _rss_mb() -> float:
  with open('/proc/self/status') as status:
    for line in status:
      if line.startswith('VmRSS'):
        return int(line.split()[1]) / 1024
  return float('nan')


_SQLITE_PAGE_SIZE = 4096


class _Sqlite:
  name = 'sqlite'

  def __init__(self, path):
    self._db = sqlite3.connect(os.path.join(path, 'store.sqlite'),
                               isolation_level=None)
    self._db.execute(f'PRAGMA page_size={_SQLITE_PAGE_SIZE}')
    self._db.execute('PRAGMA journal_mode=WAL')
    # As the store (`client_records.SqliteRecords`): a commit is fsynced.
    self._db.execute('PRAGMA synchronous=FULL')
    self._db.execute('CREATE TABLE s (user INTEGER PRIMARY KEY, state BLOB)')

  def build(self, users, make):
    self._db.execute('BEGIN')
    for start in range(0, users, 10000):
      stop = min(users, start + 10000)
      self._db.executemany('INSERT INTO s VALUES (?, ?)',
                           ((u, make(u)) for u in range(start, stop)))
    self._db.execute('COMMIT')

  def read(self, users):
    found = {}
    for start in range(0, len(users), 500):
      chunk = users[start:start + 500].tolist()
      marks = ','.join('?' * len(chunk))
      found.update(self._db.execute(
          f'SELECT user, state FROM s WHERE user IN ({marks})', chunk))
    return [found[u] for u in users.tolist()]

  def write(self, users, values):
    self._db.execute('BEGIN')
    self._db.executemany('UPDATE s SET state = ? WHERE user = ?',
                         zip(values, users.tolist()))
    self._db.execute('COMMIT')


class _Lmdb:
  name = 'lmdb'

  def __init__(self, path):
    import lmdb  # pylint: disable=g-import-not-at-top
    self._env = lmdb.open(path, map_size=1 << 40, readahead=False)

  def build(self, users, make):
    for start in range(0, users, 100000):
      with self._env.begin(write=True) as txn:
        for u in range(start, min(users, start + 100000)):
          txn.put(u.to_bytes(8, 'big'), make(u), append=True)

  def read(self, users):
    with self._env.begin() as txn:
      return [bytes(txn.get(u.to_bytes(8, 'big'))) for u in users.tolist()]

  def write(self, users, values):
    with self._env.begin(write=True) as txn:
      for u, value in zip(users.tolist(), values):
        txn.put(u.to_bytes(8, 'big'), value)


class _Rocksdb:
  name = 'rocksdb'

  def __init__(self, path):
    import rocksdict  # pylint: disable=g-import-not-at-top
    self._rocksdict = rocksdict
    options = rocksdict.Options(raw_mode=True)
    self._db = rocksdict.Rdict(path, options=options)

  def build(self, users, make):
    for start in range(0, users, 100000):
      batch = self._rocksdict.WriteBatch(raw_mode=True)
      for u in range(start, min(users, start + 100000)):
        batch.put(u.to_bytes(8, 'big'), make(u))
      self._db.write(batch)

  def read(self, users):
    return self._db[[u.to_bytes(8, 'big') for u in users.tolist()]]

  def write(self, users, values):
    batch = self._rocksdict.WriteBatch(raw_mode=True)
    for u, value in zip(users.tolist(), values):
      batch.put(u.to_bytes(8, 'big'), value)
    write_options = self._rocksdict.WriteOptions()
    write_options.sync = True
    self._db.write(batch, write_options)


class _Memmap:
  name = 'memmap'

  def __init__(self, path):
    self._path = path

  def build(self, users, make):
    record = len(make(0))
    self._map = np.lib.format.open_memmap(
        os.path.join(self._path, 'records.npy'), mode='w+', dtype=np.uint8,
        shape=(users, record))
    for start in range(0, users, 100000):
      stop = min(users, start + 100000)
      self._map[start:stop] = np.frombuffer(
          b''.join(make(u) for u in range(start, stop)), np.uint8
      ).reshape(stop - start, record)
    self._map.flush()

  def read(self, users):
    return list(self._map[users])

  def write(self, users, values):
    block = np.stack([np.frombuffer(v, np.uint8) for v in values])
    with open(os.path.join(self._path, 'journal'), 'wb') as journal:
      journal.write(users.astype(np.int64).tobytes())
      journal.write(block.tobytes())
      journal.flush()
      os.fsync(journal.fileno())
    self._map[users] = block
    self._map.flush()
    os.remove(os.path.join(self._path, 'journal'))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--users', type=int, default=1_000_000)
  parser.add_argument('--record_bytes', type=int, default=2048)
  parser.add_argument('--batch', type=int, default=10_000)
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--stores', default='sqlite,lmdb,rocksdb,memmap')
  parser.add_argument('--dir', default='/tmp/store_bench')
  parser.add_argument('--sqlite_page_size', type=int, default=4096)
  args = parser.parse_args()
  global _SQLITE_PAGE_SIZE
  _SQLITE_PAGE_SIZE = args.sqlite_page_size
  stores = {s.name: s for s in (_Sqlite, _Lmdb, _Rocksdb, _Memmap)}
  base = np.random.default_rng(0).bytes(args.record_bytes)

  def make(user):
    return user.to_bytes(8, 'little') + base[8:]

  print(f'{args.users:,} users x {args.record_bytes:,} B, batches of '
        f'{args.batch:,} random users, {args.repeats} repeats')
  print('store    build s  read s (median)  write+commit s (median)  '
        'MB/s read / write  RSS MB')
  for name in args.stores.split(','):
    path = os.path.join(args.dir, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    try:
      store = stores[name](path)
    except ImportError as error:
      print(f'{name:8s} not installed ({error})')
      continue
    start = time.perf_counter()
    store.build(args.users, make)
    built = time.perf_counter() - start
    rng = np.random.default_rng(1)
    reads, writes = [], []
    for _ in range(args.repeats):
      users = np.sort(rng.choice(args.users, args.batch, replace=False))
      start = time.perf_counter()
      values = store.read(users)
      reads.append(time.perf_counter() - start)
      assert all(bytes(v[:8]) == u.to_bytes(8, 'little')
                 for u, v in zip(users.tolist(), values))
      values = [bytes(v) for v in values]
      start = time.perf_counter()
      store.write(users, values)
      writes.append(time.perf_counter() - start)
    read, write = statistics.median(reads), statistics.median(writes)
    megabytes = args.batch * args.record_bytes / 1e6
    print(f'{name:8s} {built:7.1f}  {read:14.3f}  {write:23.3f}  '
          f'{megabytes / read:8.0f} / {megabytes / write:5.0f}  '
          f'{_rss_mb():6.0f}')
    del store
    shutil.rmtree(path, ignore_errors=True)


if __name__ == '__main__':
  main()
