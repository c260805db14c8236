"""The client-state store on disk against a dict of per-user arrays: batch
reads and writes, partitions, ragged fields, commits, and a `kill -9` at
random moments (a write included) leaving the last commit whole."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tff_fedrec import client_state_store


def _stores(tmp_path, num_users=50):
  """The same partitioned store in memory and on disk: users of even
  index keep a 2-wide `w` and a scalar `s`, odd ones a 3-wide `w`; one
  ragged field of 4-wide rows."""
  def make():
    users = np.arange(num_users)
    return client_state_store.ClientStateStore.from_partitions(
        num_users,
        [(users[::2], {'s': np.arange(users[::2].size, dtype=np.int64),
                       'w': np.ones([users[::2].size, 2], np.float32)}),
         (users[1::2], {'s': -np.arange(users[1::2].size, dtype=np.int64),
                        'w': np.zeros([users[1::2].size, 3], np.float32)})],
        ragged={'rows': np.zeros([0, 4], np.float32)})
  memory, disk = make(), make()
  assert disk.keep_on_disk(str(tmp_path / 'db.sqlite'), resume=False) == 0
  return memory, disk


def _assert_same(memory, disk, users):
  for user in users:
    mine, theirs = memory.local_parameters([user])[0], disk.local_parameters(
        [user])[0]
    assert sorted(mine) == sorted(theirs)
    for key in mine:
      np.testing.assert_array_equal(theirs[key], mine[key])
      assert np.asarray(theirs[key]).dtype == np.asarray(mine[key]).dtype
  for mine, theirs in zip(memory.ragged('rows', users),
                          disk.ragged('rows', users), strict=True):
    np.testing.assert_array_equal(theirs, mine)
    assert theirs.dtype == np.float32 and theirs.shape[1:] == (4,)


def test_batch_reads_and_writes_agree_with_the_store_in_memory(tmp_path):
  memory, disk = _stores(tmp_path)
  rng = np.random.default_rng(0)
  for _ in range(30):
    parity = int(rng.integers(2))
    users = np.sort(rng.choice(np.arange(parity, 50, 2), 7, replace=False))
    width = 2 if parity == 0 else 3
    stacked = {'s': rng.integers(-9, 9, users.size),
               'w': rng.normal(size=[users.size, width]).astype(np.float32)}
    for store in (memory, disk):
      store.put_local_parameters(users, stacked)
    ragged_users = rng.choice(50, 5, replace=False)
    values = [rng.normal(size=[int(rng.integers(0, 6)), 4]).astype(
        np.float32) for _ in ragged_users]
    for store in (memory, disk):
      store.put_ragged('rows', ragged_users, values)
    read = np.sort(rng.choice(np.arange(parity, 50, 2), 9, replace=False))
    mine, theirs = (memory.stacked_local_parameters(read),
                    disk.stacked_local_parameters(read))
    for key in mine:
      np.testing.assert_array_equal(theirs[key], mine[key])
  _assert_same(memory, disk, range(50))
  # Users of two partitions in one call, each its own nest.
  states = [{'s': np.int64(40), 'w': np.full([2], 4.0, np.float32)},
            {'s': np.int64(41), 'w': np.full([3], 5.0, np.float32)}]
  for store in (memory, disk):
    store.put_user_states([4, 5], states)
  _assert_same(memory, disk, range(50))
  assert disk.bytes_per_user() == pytest.approx(memory.bytes_per_user())
  assert disk.to_arrays() == {'local_leaves': [], 'ragged': {},
                              'columns': {}}


def test_batch_reads_and_writes_on_disk_against_a_dict(tmp_path):
  _, disk = _stores(tmp_path)
  # The plain reference: each user's state as the test wrote it.
  reference = {u: {'s': (u // 2) * (1 if u % 2 == 0 else -1),
                   'w': np.full([2 if u % 2 == 0 else 3],
                                1.0 if u % 2 == 0 else 0.0, np.float32),
                   'rows': np.zeros([0, 4], np.float32)} for u in range(50)}
  rng = np.random.default_rng(1)
  for _ in range(40):
    parity = int(rng.integers(2))
    users = rng.choice(np.arange(parity, 50, 2), int(rng.integers(1, 9)),
                       replace=False)
    width = 2 if parity == 0 else 3
    s = rng.integers(-99, 99, users.size)
    w = rng.normal(size=[users.size, width]).astype(np.float32)
    disk.put_local_parameters(users, {'s': s, 'w': w})
    rows = [rng.normal(size=[int(rng.integers(0, 5)), 4]).astype(np.float32)
            for _ in users]
    disk.put_ragged('rows', users, rows)
    for i, user in enumerate(users.tolist()):
      reference[user] = {'s': s[i], 'w': w[i], 'rows': rows[i]}
    read = rng.choice(np.arange(parity, 50, 2), 6, replace=False)
    stacked = disk.stacked_local_parameters(read)
    for i, user in enumerate(read.tolist()):
      assert stacked['s'][i] == reference[user]['s']
      np.testing.assert_array_equal(stacked['w'][i], reference[user]['w'])
    for user, got in zip(read.tolist(), disk.ragged('rows', read)):
      np.testing.assert_array_equal(got, reference[user]['rows'])
  expected_bytes = sum(8 + value['w'].nbytes + value['rows'].nbytes
                       for value in reference.values()) / 50
  assert disk.bytes_per_user() == pytest.approx(expected_bytes)


def test_a_store_built_from_one_state_writes_no_user_until_it_changes(
    tmp_path):
  store = client_state_store.ClientStateStore(
      1000, {'table': np.full([64, 8], 2.0, np.float32)},
      ragged={'ids': np.zeros([0], np.int32)})
  path = str(tmp_path / 'db.sqlite')
  store.keep_on_disk(path, resume=False)
  assert os.path.getsize(path) < 100_000  # Not 1,000 x 2 KB.
  np.testing.assert_array_equal(
      store.stacked_local_parameters(np.array([999, 3]))['table'], 2.0)
  assert store.bytes_per_user() == 64 * 8 * 4
  store.put_ragged('ids', [7], [np.arange(5)])
  assert store.bytes_per_user() == pytest.approx(64 * 8 * 4 + 20 / 1000)
  np.testing.assert_array_equal(store.ragged('ids', [7, 8])[0], np.arange(5))
  assert store.ragged('ids', [8])[0].shape == (0,)


def test_columns_agree_with_the_store_in_memory_and_survive_commits(
    tmp_path):
  def make():
    store = client_state_store.ClientStateStore(
        20, {'w': np.zeros([1], np.float32)})
    store.add_column('round', np.int64(-1))
    store.add_column('whole', np.bool_(True))
    return store
  memory, disk = make(), make()
  path = str(tmp_path / 'db.sqlite')
  disk.keep_on_disk(path, resume=False)
  for store in (memory, disk):
    store.put_column('round', [3, 1, 7], 5)
    store.put_column('whole', [1, 2], [False, True])
  disk.commit(1)
  disk.put_column('round', [0], 9)  # Never committed.
  disk.close()
  reopened = make()
  reopened.keep_on_disk(path, resume=True)
  users = np.array([7, 0, 1, 2, 3, 19])
  for name in ('round', 'whole'):
    expected = memory.column(name, users)
    got = reopened.column(name, users)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
  np.testing.assert_array_equal(memory.column('round', users),
                                [5, -1, 5, -1, 5, -1])
  with pytest.raises(ValueError, match='before keep_on_disk'):
    reopened.add_column('late', np.int64(0))


def test_only_what_was_committed_survives_the_store(tmp_path):
  memory, disk = _stores(tmp_path)
  path = str(tmp_path / 'db.sqlite')
  users = np.array([0, 2, 4])
  first = {'s': np.array([7, 8, 9]), 'w': np.full([3, 2], 3.0, np.float32)}
  for store in (memory, disk):
    store.put_local_parameters(users, first)
    store.put_ragged('rows', [1], [np.ones([2, 4], np.float32)])
  disk.commit(1)
  # Written after the commit, never committed: lost with the process.
  disk.put_local_parameters(users, {'s': np.array([0, 0, 0]),
                                    'w': np.zeros([3, 2], np.float32)})
  disk.put_ragged('rows', [1, 3], [np.zeros([5, 4], np.float32)] * 2)
  disk.close()
  (tmp_path / 'other').mkdir()
  reopened = _stores(tmp_path / 'other')[0]
  assert reopened.keep_on_disk(path, resume=True) == 1
  _assert_same(memory, reopened, range(50))
  assert reopened.bytes_per_user() == pytest.approx(memory.bytes_per_user())


def test_a_database_of_another_model_is_refused(tmp_path):
  _, disk = _stores(tmp_path)
  disk.commit(1)
  disk.close()
  other = client_state_store.ClientStateStore(
      50, {'w': np.zeros([2], np.float32)})
  with pytest.raises(ValueError, match='do not match this model'):
    other.keep_on_disk(str(tmp_path / 'db.sqlite'), resume=True)


_WRITER = textwrap.dedent('''
    import sys
    import numpy as np
    from tff_fedrec import client_state_store

    path, = sys.argv[1:]
    store = client_state_store.ClientStateStore(
        2000, {'w': np.zeros([256], np.float32)},
        ragged={'rows': np.zeros([0, 64], np.float32)})
    round_num = store.keep_on_disk(path, resume=True)
    print(round_num, flush=True)
    while True:
      round_num += 1
      # Round r writes r into every value of a seeded batch of users.
      users = np.sort(np.random.default_rng(round_num).choice(
          2000, 400, replace=False))
      store.put_local_parameters(
          users, {'w': np.full([400, 256], round_num, np.float32)})
      store.put_ragged('rows', users,
                       [np.full([round_num % 7, 64], round_num, np.float32)]
                       * 400)
      store.commit(round_num)
''')


def _expected_after(rounds):
  w = np.zeros([2000, 256], np.float32)
  rows = [np.zeros([0, 64], np.float32)] * 2000
  for round_num in range(1, rounds + 1):
    users = np.sort(np.random.default_rng(round_num).choice(
        2000, 400, replace=False))
    w[users] = round_num
    for user in users:
      rows[user] = np.full([round_num % 7, 64], round_num, np.float32)
  return w, rows


def test_a_kill_at_any_moment_leaves_the_last_commit_whole(tmp_path):
  path = str(tmp_path / 'db.sqlite')
  store = client_state_store.ClientStateStore(
      2000, {'w': np.zeros([256], np.float32)},
      ragged={'rows': np.zeros([0, 64], np.float32)})
  store.keep_on_disk(path, resume=False)
  store.close()
  env = dict(os.environ, PYTHONPATH=os.getcwd())
  rng = np.random.default_rng(5)
  last = 0
  for _ in range(4):
    writer = subprocess.Popen([sys.executable, '-c', _WRITER, path],
                              stdout=subprocess.PIPE, env=env, text=True)
    assert int(writer.stdout.readline()) == last
    # A round writes about 2.2 MB: the kill lands in a write or a commit
    # as often as between them.
    time.sleep(float(rng.uniform(0.05, 0.6)))
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    reopened = client_state_store.ClientStateStore(
        2000, {'w': np.zeros([256], np.float32)},
        ragged={'rows': np.zeros([0, 64], np.float32)})
    committed = reopened.keep_on_disk(path, resume=True)
    assert committed >= last
    w, rows = _expected_after(committed)
    users = np.arange(2000)
    np.testing.assert_array_equal(
        reopened.stacked_local_parameters(users)['w'], w)
    for got, expected in zip(reopened.ragged('rows', users), rows):
      np.testing.assert_array_equal(got, expected)
    reopened.close()
    last = committed
  assert last > 0
