"""The program-side store of every user's client state between rounds.

A TFF `IterativeProcess` is stateless about clients: the program passes each
sampled client's state into `next` and writes the returned state back here.
Every method keeps its users' state in one of these.

Layout (memory per user, see `bytes_per_user`):
- local state: the users are divided into partitions (one for all users,
  or e.g. one per tier when tiers keep models of different sizes); within
  a partition every user's local state has the same structure and shapes,
  and each leaf is one numpy array stacked over the partition's users,
  [n_p, ...];
- personal item rows (dual personalization; kept when the store is made
  with an embedding width): per user, the ids [T_u] and rows [T_u, d] of
  the item embedding rows the user fine-tuned in its last round;
- start tables (with personal rows, once a method records them,
  `record_start_table`): the item table each user started its last round
  from, whose rows score the items it did not fine-tune, as PFedRec's
  reference code scores a user with the whole table it kept after its
  round (`client_model_params[user]`). One [N, d] table is kept per round
  that some user still started from (one in all with every user in every
  round), not one per user.

A round's group of users (`templates.user_groups`) always lies in one
partition. `to_arrays` / `load_arrays` pack everything into flat numpy
arrays (CSR for the personal rows, the start tables stacked [K, N, d]
with their rounds [K] and each user's round [U]) for checkpointing.

Example (two users, one 2-wide user embedding each, no personal rows):
  >>> store = ClientStateStore.from_partitions(2, [
  ...     (np.arange(2), {'user': np.zeros([2, 2], np.float32)})])
  >>> store.put_local_parameters(np.array([1]), {'user': np.ones([1, 2])})
  >>> store.stacked_local_parameters(np.array([0, 1]))['user']
  array([[0., 0.], [1., 1.]], dtype=float32)
"""

import collections
from collections.abc import Sequence
from typing import Optional

import numpy as np
import tensorflow as tf


class ClientStateStore:
  """Client states of `num_users` users, all starting at `initial_state`.

  `initial_state` is one user's `OrderedDict(local_parameters=...,
  personal_item_ids=int32[0], personal_item_rows=float32[0, d])` (as
  `local_item_training.initial_client_state` makes it): one partition, with
  personal rows of width d. `from_partitions` makes any other layout.
  """

  def __init__(self, num_users: int, initial_state: collections.OrderedDict):
    local = initial_state['local_parameters']
    self._init(
        num_users,
        [(np.arange(num_users),
          tf.nest.map_structure(
              lambda leaf: np.repeat(np.asarray(leaf)[None], num_users,
                                     axis=0),
              local,
          ))],
        np.asarray(initial_state['personal_item_rows']).shape[1],
    )

  @classmethod
  def from_partitions(
      cls,
      num_users: int,
      partitions: Sequence[tuple[np.ndarray, object]],
      embedding_dim: Optional[int] = None,
  ) -> 'ClientStateStore':
    """A store whose partition p holds users `partitions[p][0]` (int
    [n_p], together every user once) with initial local states
    `partitions[p][1]` (a structure of arrays [n_p, ...], in that user
    order); personal rows of width `embedding_dim`, or none if None."""
    store = cls.__new__(cls)
    store._init(num_users, partitions, embedding_dim)
    return store

  def _init(self, num_users, partitions, embedding_dim):
    self._num_users = num_users
    self._partition_of = np.full([num_users], -1, np.int64)
    self._position = np.zeros([num_users], np.int64)
    self._structures, self._leaves = [], []
    for index, (users, local) in enumerate(partitions):
      users = np.asarray(users, np.int64)
      if np.any(self._partition_of[users] >= 0):
        raise ValueError('A user lies in two partitions.')
      self._partition_of[users] = index
      self._position[users] = np.arange(users.size)
      leaves = [np.array(leaf) for leaf in tf.nest.flatten(local)]
      if any(leaf.shape[:1] != (users.size,) for leaf in leaves):
        raise ValueError(
            f'Partition {index}: every leaf needs a leading dimension of '
            f'{users.size} users.'
        )
      self._structures.append(local)
      self._leaves.append(leaves)
    if np.any(self._partition_of < 0):
      raise ValueError('Every user must lie in a partition.')
    self._embedding_dim = embedding_dim
    dim = embedding_dim or 0
    self._personal_ids = [np.zeros([0], np.int32)] * num_users
    self._personal_rows = [np.zeros([0, dim], np.float32)] * num_users
    self._row_index = None
    # -1: no start table (the caller's table scores its untrained rows).
    self._start_round = np.full([num_users], -1, np.int64)
    self._start_tables = {}
    self._users_per_start_table = {}

  @property
  def num_users(self) -> int:
    return self._num_users

  @property
  def keeps_personal_rows(self) -> bool:
    return self._embedding_dim is not None

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

  def get(self, users: Sequence[int]) -> list[collections.OrderedDict]:
    """The client states of `users`, in order (local parameters and rows)."""
    return [
        collections.OrderedDict(
            local_parameters=local,
            personal_item_ids=self._personal_ids[user],
            personal_item_rows=self._personal_rows[user],
        )
        for user, local in zip(users, self.local_parameters(users))
    ]

  def local_parameters(self, users: Sequence[int]) -> list:
    """The local state of each of `users`, in order."""
    users = np.asarray(users, np.int64)
    return [
        tf.nest.pack_sequence_as(
            self._structures[partition],
            [leaf[position] for leaf in self._leaves[partition]],
        )
        for partition, position in zip(
            self._partition_of[users], self._position[users]
        )
    ]

  def put(self, users: Sequence[int], states: Sequence) -> None:
    """Stores the states returned by a round for `users` (same order):
    `OrderedDict(local_parameters, personal_item_ids, personal_item_rows)`
    each."""
    users = np.asarray(users, np.int64)
    for user, partition, position, state in zip(
        users, self._partition_of[users], self._position[users], states,
        strict=True,
    ):
      for leaf_store, leaf in zip(
          self._leaves[partition], tf.nest.flatten(state['local_parameters'])
      ):
        leaf_store[position] = leaf
      self._personal_ids[user] = np.asarray(
          state['personal_item_ids'], np.int32
      )
      self._personal_rows[user] = np.asarray(
          state['personal_item_rows'], np.float32
      )
    self._row_index = None

  def put_group(self, users: np.ndarray, group_state, num_rows) -> None:
    """Stores a group's state as a process returned it: with personal rows
    `OrderedDict(local_parameters [U, ...], personal_item_ids [U, T],
    personal_item_rows [U, T, d])`, of which user u keeps its first
    num_rows[u] rows; without, the local state [U, ...] alone."""
    if not self.keeps_personal_rows:
      self.put_local_parameters(users, group_state)
      return
    ids = np.asarray(group_state['personal_item_ids'])
    rows = np.asarray(group_state['personal_item_rows'])
    local = tf.nest.map_structure(np.asarray, group_state['local_parameters'])
    states = []
    for index, count in enumerate(np.asarray(num_rows)):
      count = min(int(count), ids.shape[1])
      states.append(collections.OrderedDict(
          local_parameters=tf.nest.map_structure(
              lambda leaf, i=index: leaf[i], local
          ),
          personal_item_ids=ids[index, :count],
          personal_item_rows=rows[index, :count],
      ))
    self.put(users, states)

  def put_local_parameters(self, users: np.ndarray, stacked) -> None:
    """Sets the local state of `users` from arrays with a leading user
    dimension (the inverse of `stacked_local_parameters`); personal rows
    stay as they are."""
    partition, positions = self._partition(users)
    for leaf_store, leaf in zip(
        self._leaves[partition], tf.nest.flatten(stacked)
    ):
      leaf_store[positions] = np.asarray(leaf)

  def stacked_local_parameters(self, users: np.ndarray):
    """The local state of `users` (all of one partition) with a leading
    user dimension [U, ...]."""
    partition, positions = self._partition(users)
    return tf.nest.pack_sequence_as(
        self._structures[partition],
        [leaf[positions] for leaf in self._leaves[partition]],
    )

  def _personal_row_index(self, num_items: int):
    """(sorted keys user * num_items + item, their rows), built once per put."""
    if self._row_index is None or self._row_index[0] != num_items:
      counts = np.array([ids.size for ids in self._personal_ids], np.int64)
      owner = np.repeat(np.arange(self._num_users, dtype=np.int64), counts)
      keys = owner * num_items + np.concatenate(self._personal_ids)
      rows = np.concatenate(self._personal_rows)
      order = np.argsort(keys, kind='stable')
      self._row_index = (num_items, keys[order], rows[order])
    return self._row_index[1:]

  def record_start_table(
      self, users: np.ndarray, round_num: int, table: np.ndarray
  ) -> None:
    """Notes that `users` start round `round_num` from item table `table`
    [N, d]: after the round, their rows they do not fine-tune are read from
    it (module docstring). Tables no user starts from any more are
    dropped."""
    if not self.keeps_personal_rows:
      raise ValueError('Start tables score the rows a user did not '
                       'fine-tune; this store keeps no personal rows.')
    users = np.unique(np.asarray(users, np.int64))
    if not users.size:
      return
    # Only this round's users change tables: the work follows them, not
    # the whole population.
    previous, counts = np.unique(self._start_round[users],
                                 return_counts=True)
    for old, leaving in zip(previous.tolist(), counts.tolist()):
      if old < 0:
        continue
      self._users_per_start_table[old] -= leaving
      if not self._users_per_start_table[old]:
        del self._users_per_start_table[old]
        del self._start_tables[old]
    round_num = int(round_num)
    self._start_tables[round_num] = np.array(table, np.float32)
    self._start_round[users] = round_num
    self._users_per_start_table[round_num] = (
        self._users_per_start_table.get(round_num, 0) + users.size
    )

  @property
  def num_start_tables(self) -> int:
    return len(self._start_tables)

  def item_vectors(
      self, users: np.ndarray, items: np.ndarray, item_embedding: np.ndarray,
      *, start_vectors: Optional[np.ndarray] = None,
  ) -> np.ndarray:
    """Each user's view of `items` [U, C]: its personal row if any, else
    the row of the table it started its last round from: `start_vectors`
    [U, C, d] if given (a method that keeps that table itself), else the
    recorded start table, else `item_embedding`'s row (the global table).

    Returns float32 [U, C, d].
    """
    if start_vectors is not None:
      vectors = np.array(start_vectors, np.float32)
    else:
      vectors = item_embedding[items]
      starts = self._start_round[np.asarray(users, np.int64)]
      for round_num in np.unique(starts[starts >= 0]):
        mine = starts == round_num
        vectors[mine] = self._start_tables[int(round_num)][items[mine]]
    num_items = item_embedding.shape[0]
    keys, rows = self._personal_row_index(num_items)
    if not keys.size:
      return vectors
    wanted = np.asarray(users, np.int64)[:, None] * num_items + items
    position = np.minimum(np.searchsorted(keys, wanted), keys.size - 1)
    found = keys[position] == wanted
    vectors[found] = rows[position[found]]
    return vectors

  def bytes_per_user(self) -> float:
    """Mean bytes of client state held per user."""
    total = sum(leaf.nbytes for leaves in self._leaves for leaf in leaves)
    total += sum(ids.nbytes for ids in self._personal_ids)
    total += sum(rows.nbytes for rows in self._personal_rows)
    if self._start_tables:
      total += sum(table.nbytes for table in self._start_tables.values())
      total += self._start_round.nbytes
    return total / self._num_users

  def to_arrays(self) -> collections.OrderedDict:
    """Flat numpy arrays holding the whole store (for checkpoints)."""
    counts = np.array([ids.size for ids in self._personal_ids], np.int64)
    rounds = sorted(self._start_tables)
    dim = self._embedding_dim or 0
    return collections.OrderedDict(
        local_leaves=[leaf.copy() for leaves in self._leaves for leaf in leaves],
        personal_offsets=np.concatenate([[0], np.cumsum(counts)]),
        personal_ids=np.concatenate(self._personal_ids),
        personal_rows=np.concatenate(self._personal_rows),
        start_round=self._start_round.copy(),
        start_table_rounds=np.array(rounds, np.int64),
        start_tables=(
            np.stack([self._start_tables[r] for r in rounds]) if rounds
            else np.zeros([0, 0, dim], np.float32)
        ),
    )

  def load_arrays(self, arrays) -> None:
    """Restores the store from `to_arrays` output."""
    leaves = [np.asarray(leaf) for leaf in arrays['local_leaves']]
    expected = [leaf.shape for partition in self._leaves for leaf in partition]
    if [leaf.shape for leaf in leaves] != expected:
      raise ValueError(
          'Checkpointed client states do not match this model: local '
          f'state shapes {[leaf.shape for leaf in leaves]} vs {expected}.'
      )
    for partition in self._leaves:
      for index in range(len(partition)):
        partition[index] = leaves.pop(0).copy()
    offsets = np.asarray(arrays['personal_offsets'])
    ids = np.asarray(arrays['personal_ids'], np.int32)
    rows = np.asarray(arrays['personal_rows'], np.float32)
    self._personal_ids = [
        ids[offsets[u] : offsets[u + 1]] for u in range(self._num_users)
    ]
    self._personal_rows = [
        rows[offsets[u] : offsets[u + 1]] for u in range(self._num_users)
    ]
    self._row_index = None
    start_round = np.asarray(arrays['start_round'], np.int64)
    rounds = np.asarray(arrays['start_table_rounds'], np.int64)
    tables = np.asarray(arrays['start_tables'], np.float32)
    if start_round.shape != (self._num_users,) or len(tables) != rounds.size:
      raise ValueError(
          'Checkpointed client states do not match this model: start '
          f'rounds of {start_round.shape} users (expected '
          f'{self._num_users}), {len(tables)} start tables for '
          f'{rounds.size} rounds.'
      )
    self._start_round = start_round.copy()
    self._start_tables = {
        int(r): table.copy() for r, table in zip(rounds, tables)
    }
    live, counts = np.unique(start_round[start_round >= 0],
                             return_counts=True)
    self._users_per_start_table = dict(zip(live.tolist(), counts.tolist()))


class OwnTableStore(ClientStateStore):
  """Client states of users that each keep an item table of their own
  across rounds, every one starting from one `initial_table` [I, d].

  A dense table per user does not fit (ML-1M: 6,040 x 3,706 x 32 float32
  is 2.9 GB), so the store keeps the initial table once and, per user, the
  rows it has trained in any round (its personal rows, sorted by id):
  after a round the user's new rows replace its old ones of the same
  items and its other rows stay. A row it never trained is the initial
  table's. Optionally a per-user scale, read from its local state, shrinks
  the rows a round did not train (FedRAP's weight decay reaches every row
  of D^(i)): `untrained_scale_key` names the scale of the rows it never
  trained (s_i: they are s_i x initial_table[j]), `round_scale_key` what
  its last round multiplied the rows outside the round's table by.

  Users: APFR-GKD with `client_start='own_model'` (each client's model is
  its own, Algorithm 1's theta_t^i <- theta_{t-1}^i - eta grad) and
  FedRAP's D^(i). Checkpoints are the base store's arrays; the initial
  table is rebuilt from the seed.

  Example:
    >>> store = OwnTableStore(num_users, initial_state, initial_table)
    >>> store.table_vectors(np.array([0]), np.array([[3, 5]]))  # [1, 2, d]
  """

  def __init__(self, num_users: int, initial_state: collections.OrderedDict,
               initial_table: np.ndarray, *,
               untrained_scale_key: Optional[str] = None,
               round_scale_key: Optional[str] = None):
    super().__init__(num_users, initial_state)
    if (untrained_scale_key is None) != (round_scale_key is None):
      raise ValueError('Give both scale keys or neither.')
    self._initial_table = np.asarray(initial_table, np.float32)
    self._untrained_scale_key = untrained_scale_key
    self._round_scale_key = round_scale_key

  @property
  def initial_table(self) -> np.ndarray:
    return self._initial_table

  def table_vectors(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Each of `users`' [U] own rows of `items` int [U, C]: float32
    [U, C, d]."""
    users = np.asarray(users, np.int64)
    items = np.asarray(items)
    vectors = self._initial_table[items]
    if self._untrained_scale_key is not None:
      scales = np.asarray(
          self.stacked_local_parameters(users)[self._untrained_scale_key],
          np.float32,
      )
      vectors = vectors * scales[:, None, None]
    for index, state in enumerate(self.get(users)):
      ids = state['personal_item_ids']
      if not ids.size:
        continue
      position = np.minimum(np.searchsorted(ids, items[index]), ids.size - 1)
      found = ids[position] == items[index]
      vectors[index, found] = state['personal_item_rows'][position[found]]
    return vectors

  def put_group(self, users: np.ndarray, group_state, num_rows) -> None:
    """Merges a group's round into the store: `group_state` is
    `OrderedDict(local_parameters [U, ...], personal_item_ids [U, T] (the
    user's round table, distinct sorted ids), personal_item_rows [U, T,
    d])`, of which user u trained its first num_rows[u] rows."""
    ids = np.asarray(group_state['personal_item_ids'])
    rows = np.asarray(group_state['personal_item_rows'])
    local = tf.nest.map_structure(np.asarray, group_state['local_parameters'])
    scales = (np.ones(len(users), np.float32) if self._round_scale_key is None
              else local[self._round_scale_key])
    states = []
    for index, (count, previous) in enumerate(
        zip(np.asarray(num_rows), self.get(users), strict=True)
    ):
      new_ids = ids[index, : int(count)]
      old_ids = previous['personal_item_ids']
      kept = ~np.isin(old_ids, new_ids)
      merged_ids = np.concatenate([old_ids[kept], new_ids])
      merged_rows = np.concatenate([
          previous['personal_item_rows'][kept] * scales[index],
          rows[index, : int(count)],
      ])
      order = np.argsort(merged_ids, kind='stable')
      states.append(collections.OrderedDict(
          local_parameters=tf.nest.map_structure(
              lambda leaf, i=index: leaf[i], local
          ),
          personal_item_ids=merged_ids[order],
          personal_item_rows=merged_rows[order],
      ))
    self.put(users, states)

  def bytes_per_user(self) -> float:
    """Mean bytes per user of client state, the initial table's share
    included."""
    return (super().bytes_per_user()
            + self._initial_table.nbytes / self.num_users)
