"""The program-side store of every user's client state between rounds.

A TFF `IterativeProcess` is stateless about clients: the program passes each
sampled client's state into `next` and writes the returned state back here.
Every method keeps its users' state in one of these; it knows nothing of
what the arrays mean (items, tiers, optimizers).

A user's state has two parts:
- stacked: a nest of arrays of fixed shapes. The users are divided into
  partitions (one for all users, or e.g. one per tier when tiers keep
  models of different sizes); within a partition every user's nest has the
  same structure and shapes, and each leaf is one numpy array stacked over
  the partition's users, [n_p, ...]. A group of users that a round
  trains together (`templates.user_groups`) lies in one partition.
- ragged (optional): named arrays whose leading dimension differs from
  user to user (e.g. the rows of a table a user trained), each user's
  [T_u, ...] kept on its own.

The arrays live in memory (`client_records.MemoryRecords`, the default:
`to_arrays` / `load_arrays` pack everything into flat numpy arrays, CSR
offsets and values for each ragged field, which a checkpoint writes) or,
after `keep_on_disk`, in an SQLite database
(`client_records.SqliteRecords`: a checkpoint is `commit`, which writes
only what changed since the last one).

Example (two users, one 2-wide user embedding each):
  >>> store = ClientStateStore(2, {'user': np.zeros([2], np.float32)})
  >>> store.put_local_parameters(np.array([1]), {'user': np.ones([1, 2])})
  >>> store.stacked_local_parameters(np.array([0, 1]))['user']
  array([[0., 0.], [1., 1.]], dtype=float32)
"""

import collections
from collections.abc import Mapping, Sequence
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_fedrec import client_records


class ClientStateStore:
  """Client states of `num_users` users, all starting at `initial_state`.

  Args:
    num_users: U.
    initial_state: One user's stacked state, a nest of arrays (one
      partition holding every user).
    ragged: {name: one user's initial array [T, ...] of the ragged
      fields (T may be 0); every user starts with that array.
  """

  def __init__(self, num_users: int, initial_state,
               ragged: Optional[Mapping[str, np.ndarray]] = None):
    # Read-only broadcasts: a user's own copy is made when a leaf is first
    # written (in memory) or never (on disk, where a user without a row
    # holds the initial state), so an untouched store costs nothing per
    # user.
    self._init(
        num_users,
        [(np.arange(num_users),
          tf.nest.map_structure(
              lambda leaf: np.broadcast_to(
                  np.asarray(leaf)[None],
                  (num_users, *np.shape(leaf))),
              initial_state,
          ))],
        ragged,
        copy=False,
    )
    self._initial_leaves = [
        [np.asarray(leaf) for leaf in tf.nest.flatten(initial_state)]]

  @classmethod
  def from_partitions(
      cls,
      num_users: int,
      partitions: Sequence[tuple[np.ndarray, object]],
      ragged: Optional[Mapping[str, np.ndarray]] = None,
  ) -> 'ClientStateStore':
    """A store whose partition p holds users `partitions[p][0]` (int
    [n_p], together every user once) with initial stacked states
    `partitions[p][1]` (a nest of arrays [n_p, ...], in that user order);
    `ragged` as in the constructor."""
    store = cls.__new__(cls)
    store._init(num_users, partitions, ragged, copy=True)
    store._initial_leaves = [None] * len(partitions)
    return store

  def _init(self, num_users, partitions, ragged, *, copy):
    self._num_users = num_users
    self._partition_of = np.full([num_users], -1, np.int64)
    self._position = np.zeros([num_users], np.int64)
    self._structures, leaves_per_partition = [], []
    self._partition_users = []
    for index, (users, local) in enumerate(partitions):
      users = np.asarray(users, np.int64)
      if np.any(self._partition_of[users] >= 0):
        raise ValueError('A user lies in two partitions.')
      self._partition_of[users] = index
      self._position[users] = np.arange(users.size)
      self._partition_users.append(users)
      leaves = [np.array(leaf, copy=copy) if copy else np.asarray(leaf)
                for leaf in tf.nest.flatten(local)]
      if any(leaf.shape[:1] != (users.size,) for leaf in leaves):
        raise ValueError(
            f'Partition {index}: every leaf needs a leading dimension of '
            f'{users.size} users.'
        )
      # The nest's structure only: its arrays would be a second store.
      self._structures.append(tf.nest.map_structure(lambda _: 0, local))
      leaves_per_partition.append(leaves)
    if np.any(self._partition_of < 0):
      raise ValueError('Every user must lie in a partition.')
    self._ragged_initial = collections.OrderedDict(
        (name, np.asarray(initial)) for name, initial in (ragged or {}).items()
    )
    self._column_initial = collections.OrderedDict()
    self._records = client_records.MemoryRecords(
        leaves_per_partition,
        collections.OrderedDict(
            (name, [initial] * num_users)
            for name, initial in self._ragged_initial.items()),
    )

  def add_column(self, name: str, initial) -> None:
    """Adds a per-user scalar column of the store's own bookkeeping (not
    client state a process sees: e.g. the round a user last started from),
    every user starting at `initial` (a numpy scalar of its dtype); before
    the store goes on disk."""
    if self.on_disk or name in self._column_initial:
      raise ValueError(f'Column {name!r}: add each column once, before '
                       'keep_on_disk.')
    initial = np.asarray(initial)
    self._column_initial[name] = initial
    self._records.add_column(
        name, np.full([self._num_users], initial, initial.dtype))

  def column(self, name: str, users) -> np.ndarray:
    """[len(users)]: column `name` of `users` (`add_column`)."""
    return self._records.column(name, np.asarray(users, np.int64))

  def put_column(self, name: str, users, values) -> None:
    """Sets column `name` of `users` to `values` (one, or one each)."""
    self._records.put_column(name, np.asarray(users, np.int64),
                             np.asarray(values,
                                        self._column_initial[name].dtype))

  def keep_on_disk(self, path: str, *, resume: bool) -> int:
    """Moves the store into an SQLite database at `path`
    (`client_records.SqliteRecords`), before any round: a new one holding
    the store's state as it is (`resume=False`), or the one an earlier
    process of the run left there (`resume=True`), at its last commit.
    From then on `commit` is the store's checkpoint and `to_arrays` holds
    only what a subclass keeps beside the users' arrays.

    Returns:
      The round the database's state completes (0 for a new one).
    """
    if self.on_disk:
      raise ValueError(f'The store is on disk already, in '
                       f'{self._records.path}.')
    partitions = self._records.partition_leaves
    arguments = (path, self._partition_of, self._initial_leaves,
                 [client_records.layout(leaves) for leaves in partitions],
                 self._ragged_initial, self._column_initial)
    if resume:
      self._records = client_records.SqliteRecords.open(*arguments)
    else:
      rows = [
          (index, self._partition_users[index], leaves)
          for index, leaves in enumerate(partitions)
          if self._initial_leaves[index] is None]
      self._records = client_records.SqliteRecords.create(*arguments,
                                                          rows=rows)
    return self._records.committed_round()

  @property
  def on_disk(self) -> bool:
    return isinstance(self._records, client_records.SqliteRecords)

  def commit(self, round_num: int) -> None:
    """On disk: makes the state durable as that after `round_num` rounds
    (`keep_on_disk`); in memory: nothing (a checkpoint writes
    `to_arrays`)."""
    self._records.commit(round_num)

  def close(self) -> None:
    """Closes the database of a store on disk (uncommitted writes are
    lost); nothing in memory."""
    self._records.close()

  @property
  def num_users(self) -> int:
    return self._num_users

  @property
  def ragged_fields(self) -> tuple[str, ...]:
    return tuple(self._ragged_initial)

  def _partition(self, users) -> tuple[int, np.ndarray]:
    """(the partition of `users`, their positions in it)."""
    users = np.asarray(users, np.int64)
    partitions = np.unique(self._partition_of[users])
    if partitions.size > 1:
      raise ValueError(
          f'Users {users.tolist()} lie in {partitions.size} partitions; a '
          'group must lie in one.'
      )
    partition = int(partitions[0]) if partitions.size else 0
    return partition, self._position[users]

  def local_parameters(self, users: Sequence[int]) -> list:
    """The stacked state of each of `users`, in order, without the leading
    dimension."""
    users = np.asarray(users, np.int64)
    return [
        tf.nest.pack_sequence_as(
            self._structures[partition],
            self._records.stacked_one(partition, user, position),
        )
        for user, partition, position in zip(
            users.tolist(), self._partition_of[users], self._position[users]
        )
    ]

  def stacked_local_parameters(self, users: np.ndarray):
    """The stacked state of `users` (all of one partition) with a leading
    user dimension [U, ...]."""
    users = np.asarray(users, np.int64)
    partition, positions = self._partition(users)
    return tf.nest.pack_sequence_as(
        self._structures[partition],
        self._records.stacked(partition, users, positions),
    )

  def put_local_parameters(self, users: np.ndarray, stacked) -> None:
    """Sets the stacked state of `users` (all of one partition) from
    arrays with a leading user dimension (the inverse of
    `stacked_local_parameters`)."""
    users = np.asarray(users, np.int64)
    partition, positions = self._partition(users)
    self._records.put_stacked(
        partition, users, positions,
        [np.asarray(leaf) for leaf in tf.nest.flatten(stacked)])

  def put_user_states(self, users: Sequence[int], states: Sequence) -> None:
    """Sets the stacked state of each of `users` from its own nest (no
    leading dimension; the users may lie in several partitions)."""
    users = np.asarray(users, np.int64)
    if len(states) != users.size:
      raise ValueError(f'{users.size} users, {len(states)} states.')
    partitions = self._partition_of[users]
    for partition in np.unique(partitions).tolist():
      mine = np.flatnonzero(partitions == partition)
      leaves = [np.stack(column) for column in zip(
          *(tf.nest.flatten(states[i]) for i in mine.tolist()))]
      self._records.put_stacked(partition, users[mine],
                                self._position[users[mine]], leaves)

  def ragged(self, name: str, users: Sequence[int]) -> list[np.ndarray]:
    """Each of `users`' array of ragged field `name`, in order."""
    return self._records.ragged(name, np.asarray(users, np.int64))

  def put_ragged(self, name: str, users: Sequence[int],
                 values: Sequence[np.ndarray]) -> None:
    """Sets each of `users`' array of ragged field `name`."""
    users = np.asarray(users, np.int64)
    if len(values) != users.size:
      raise ValueError(f'{users.size} users, {len(values)} values.')
    dtype = self._ragged_initial[name].dtype
    self._records.put_ragged(name, users,
                             [np.asarray(value, dtype) for value in values])

  def put_group(self, users: np.ndarray, group_state, group_data) -> None:
    """Stores the new state a round's group of `users` returned, given the
    group's client data (`templates.user_groups.run_round` calls this): by
    default the state is the stacked state [U, ...]. A store whose methods
    return more (e.g. ragged rows) says how to keep it."""
    del group_data
    self.put_local_parameters(users, group_state)

  def bytes_per_user(self) -> float:
    """Mean bytes of client state held per user (kept up to date as the
    store changes: no pass over every user)."""
    return self._records.nbytes() / self._num_users

  def to_arrays(self, *, copy: bool = True) -> collections.OrderedDict:
    """Flat arrays holding the whole store (for checkpoints): the stacked
    leaves, and per ragged field CSR `offsets` [U + 1] and `values` as a
    `csr.ValuesInPieces` (the users' arrays, not a concatenated copy of
    them: `np.asarray` builds it, a checkpoint writes it piece by piece).
    On disk (`keep_on_disk`) no leaves and no fields: the database is its
    own checkpoint.

    Args:
      copy: False gives the store's own stacked leaves, not copies: for a
        caller that writes them out before the store next changes (a
        checkpoint; FedRAS's users' table copies are 2.9 GB on ML-1M). The
        ragged values are a snapshot either way (a put replaces a user's
        array, never changes it).
    """
    return self._records.to_arrays(copy=copy)

  def load_arrays(self, arrays) -> None:
    """Restores the store from `to_arrays` output."""
    self._records.load_arrays(arrays, self._num_users)
