"""The client state of the local-item methods: each user's local
parameters and the item rows it fine-tuned, over a generic
`client_state_store.ClientStateStore`.

  PersonalRowsStore  per user, its stacked local parameters and, as two
                     ragged fields, the ids [T_u] and rows [T_u, d] of the
                     item embedding rows it fine-tuned in its last round
                     (dual personalization, PFedRec Sec. 4.2), and the
                     item table each user started its last round from,
                     whose rows score the items it did not fine-tune, as
                     PFedRec's reference code scores a user with the whole
                     table it kept after its round
                     (`client_model_params[user]`): one [N, d] table per
                     round that some user still started from (one in all
                     with every user in every round), not one per user.
  OwnTableStore      users that keep an item table of their own across
                     rounds: the rows they ever trained, merged round after
                     round, over one shared initial table (APFR-GKD's
                     `own_model`, FedRAP's D^(i)).

Between a user's rounds its fine-tuned rows serve only to score it, so a
round may keep just the rows of the items the protocol scores the user on
(`kept_rows`; PFedRec ML-100K under leave-one-out: about a tenth of them),
which is what crosses from the TFF worker to the program and what the
store holds; a user's last round of the run keeps them all, as a phone's
model (export) has every row. The store marks whose rows are whole.

Checkpoints (`to_arrays`) are the base store's arrays (each user's start
round and whether its rows are whole are two of its columns) plus the
start tables stacked [K, N, d] with their rounds [K] and users [K].

Example (two users, no personal rows yet):
  >>> store = PersonalRowsStore(2, collections.OrderedDict(
  ...     local_parameters={'user': np.zeros([2], np.float32)},
  ...     personal_item_ids=np.zeros([0], np.int32),
  ...     personal_item_rows=np.zeros([0, 4], np.float32)))
  >>> store.item_vectors(np.array([0]), np.array([[3]]), table)  # [1, 1, 4]
"""

import collections
from collections.abc import Sequence
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_fedrec import client_state_store
from tff_fedrec.templates import user_groups

_IDS = 'personal_item_ids'
_ROWS = 'personal_item_rows'
_START_ROUND = 'start_round'
_WHOLE_ROWS = 'whole_rows'


def kept_rows(row_ids: np.ndarray, num_rows: np.ndarray,
              scored: Sequence[Optional[np.ndarray]]
              ) -> collections.OrderedDict:
  """Which trained rows each user of a group keeps: for user u (compact
  table `row_ids` [U, T] of `num_rows` [U] real rows), the positions of
  the rows whose items are in `scored[u]` (ascending item ids), or of all
  its rows if `scored[u]` is None.

  Returns `OrderedDict(kept_rows int32 [U, K] (ascending positions, padded
  with 0), num_kept_rows int32 [U])`, client data of the local-item
  process (`client_training.client_data_type`).
  """
  positions = [
      np.arange(int(count)) if items is None
      else np.flatnonzero(np.isin(ids[: int(count)], items))
      for ids, count, items in zip(row_ids, num_rows, scored, strict=True)
  ]
  return collections.OrderedDict(
      kept_rows=user_groups.pad_rows(positions, np.int32),
      num_kept_rows=np.array([p.size for p in positions], np.int32),
  )


class PersonalRowsStore(client_state_store.ClientStateStore):
  """Client states of `num_users` users, all starting at `initial_state`,
  one user's `OrderedDict(local_parameters=..., personal_item_ids=
  int32[0], personal_item_rows=float32[0, d])` (as
  `client_training.initial_client_state` makes it)."""

  # Whether a later round trains from the rows kept (then every round
  # keeps them all), or they only score the user.
  trains_from_rows = False

  def __init__(self, num_users: int, initial_state: collections.OrderedDict):
    super().__init__(
        num_users, initial_state['local_parameters'],
        ragged=collections.OrderedDict((
            (_IDS, np.zeros([0], np.int32)),
            (_ROWS, np.zeros(
                [0, np.shape(initial_state[_ROWS])[1]], np.float32)),
        )),
    )
    # Per user, the round whose start table it started its last round
    # from; -1: none (the caller's table scores its untrained rows).
    self.add_column(_START_ROUND, np.int64(-1))
    # Whether each user holds every row it fine-tuned in its last round
    # (module docstring); a user that has not trained holds none to miss.
    self.add_column(_WHOLE_ROWS, np.bool_(True))
    self._start_tables = {}
    self._users_per_start_table = {}

  def get(self, users: Sequence[int]) -> list[collections.OrderedDict]:
    """The client states of `users`, in order (local parameters and rows)."""
    return [
        collections.OrderedDict(
            local_parameters=local, personal_item_ids=ids,
            personal_item_rows=rows,
        )
        for local, ids, rows in zip(
            self.local_parameters(users), self.ragged(_IDS, users),
            self.ragged(_ROWS, users))
    ]

  def put(self, users: Sequence[int], states: Sequence) -> None:
    """Stores the states of `users` (same order): `OrderedDict(
    local_parameters, personal_item_ids, personal_item_rows)` each."""
    self.put_user_states(users, [s['local_parameters'] for s in states])
    self.put_ragged(_IDS, users, [s[_IDS] for s in states])
    self.put_ragged(_ROWS, users, [s[_ROWS] for s in states])

  def put_group(self, users: np.ndarray, group_state, group_data) -> None:
    """Stores a group's state as a process returned it: `OrderedDict(
    local_parameters [U, ...], personal_item_ids [U, K],
    personal_item_rows [U, K, d])`, of which user u keeps its first
    group_data['num_kept_rows'][u] rows (`kept_rows`; without that field,
    its first group_data['num_rows'][u]: all it trained)."""
    ids = np.asarray(group_state[_IDS])
    rows = np.asarray(group_state[_ROWS])
    trained = np.asarray(group_data['num_rows'])
    kept = np.asarray(group_data.get('num_kept_rows', trained))
    counts = [min(int(count), ids.shape[1]) for count in kept]
    self.put_column(_WHOLE_ROWS, users, kept == trained)
    self.put_local_parameters(users, group_state['local_parameters'])
    self.put_ragged(_IDS, users, [ids[u, :n] for u, n in enumerate(counts)])
    self.put_ragged(_ROWS, users, [rows[u, :n] for u, n in enumerate(counts)])

  def _write_personal_rows(self, users, items, vectors) -> None:
    """Writes over `vectors` [U, C, d] each user's personal rows of its
    `items` [U, C] (the first of duplicated ids). One user at a time, so a
    lookup costs what the batch's users hold: an index over every user's
    rows was rebuilt after every round and copied all of them twice (1.4 s
    of a 12 s PFedRec round on ML-1M, 1.2 GB)."""
    all_ids = self.ragged(_IDS, users)
    all_rows = self.ragged(_ROWS, users)
    for position, (ids, rows) in enumerate(zip(all_ids, all_rows)):
      if not ids.size:
        continue
      if ids.size > 1 and not np.all(ids[1:] > ids[:-1]):
        order = np.argsort(ids, kind='stable')
        ids, rows = ids[order], rows[order]
      wanted = items[position]
      index = np.minimum(np.searchsorted(ids, wanted), ids.size - 1)
      found = ids[index] == wanted
      vectors[position, found] = rows[index[found]]

  def record_start_table(
      self, users: np.ndarray, round_num: int, table: np.ndarray
  ) -> None:
    """Notes that `users` start round `round_num` from item table `table`
    [N, d]: after the round, their rows they do not fine-tune are read from
    it (module docstring). Tables no user starts from any more are
    dropped."""
    users = np.unique(np.asarray(users, np.int64))
    if not users.size:
      return
    # Only this round's users change tables: the work follows them, not
    # the whole population.
    previous, counts = np.unique(self.column(_START_ROUND, users),
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
    self.put_column(_START_ROUND, users, round_num)
    self._users_per_start_table[round_num] = (
        self._users_per_start_table.get(round_num, 0) + users.size
    )

  def has_whole_rows(self, users) -> np.ndarray:
    """bool [len(users)]: whether each user holds every row it fine-tuned
    in its last round (not only the ones the protocol scores)."""
    return self.column(_WHOLE_ROWS, users)

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
      starts = self.column(_START_ROUND, users)
      tables = np.unique(starts)
      if tables.size == 1 and tables[0] >= 0:
        # Every user started from one table (all users every round).
        vectors = self._start_tables[int(tables[0])][items]
      else:
        vectors = item_embedding[items]
        for round_num in tables[tables >= 0]:
          mine = starts == round_num
          vectors[mine] = self._start_tables[int(round_num)][items[mine]]
    self._write_personal_rows(np.asarray(users, np.int64), items, vectors)
    return vectors

  def bytes_per_user(self) -> float:
    """Mean bytes of client state held per user, start tables included."""
    total = super().bytes_per_user() * self.num_users
    if self._start_tables:
      total += sum(table.nbytes for table in self._start_tables.values())
      # The start rounds (8 bytes a user) count once a table is kept.
      total += 8 * self.num_users
    return total / self.num_users

  def to_arrays(self, *, copy: bool = True) -> collections.OrderedDict:
    """The base store's arrays (the start rounds and whole-row marks are
    its columns), the start tables stacked [K, N, d] with their rounds [K]
    and how many users start from each [K]: what changes with the
    rounds' users, never an array over every user."""
    arrays = super().to_arrays(copy=copy)
    rounds = sorted(self._start_tables)
    dim = np.shape(self.ragged(_ROWS, [0])[0])[1]
    arrays['start_table_rounds'] = np.array(rounds, np.int64)
    arrays['start_table_users'] = np.array(
        [self._users_per_start_table[r] for r in rounds], np.int64)
    arrays['start_tables'] = (
        np.stack([self._start_tables[r] for r in rounds]) if rounds
        else np.zeros([0, 0, dim], np.float32)
    )
    return arrays

  def load_arrays(self, arrays) -> None:
    super().load_arrays(arrays)
    rounds = np.asarray(arrays['start_table_rounds'], np.int64)
    users = np.asarray(arrays['start_table_users'], np.int64)
    tables = np.asarray(arrays['start_tables'], np.float32)
    if len(tables) != rounds.size or users.shape != rounds.shape:
      raise ValueError(
          'Checkpointed client states do not match this model: '
          f'{len(tables)} start tables and {users.size} counts of their '
          f'users for {rounds.size} rounds.'
      )
    self._start_tables = {
        int(r): table.copy() for r, table in zip(rounds, tables)
    }
    self._users_per_start_table = dict(zip(rounds.tolist(), users.tolist()))


class OwnTableStore(PersonalRowsStore):
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
  FedRAP's D^(i) (`fedrap.client_state`). Checkpoints are the base store's
  arrays; the initial table is rebuilt from the seed.

  Example:
    >>> store = OwnTableStore(num_users, initial_state, initial_table)
    >>> store.table_vectors(np.array([0]), np.array([[3, 5]]))  # [1, 2, d]
  """

  trains_from_rows = True

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

  def put_group(self, users: np.ndarray, group_state, group_data) -> None:
    """Merges a group's round into the store: `group_state` is
    `OrderedDict(local_parameters [U, ...], personal_item_ids [U, T] (the
    user's round table, distinct sorted ids), personal_item_rows [U, T,
    d])`, of which user u trained its first group_data['num_rows'][u]
    rows."""
    num_rows = group_data['num_rows']
    if 'num_kept_rows' in group_data and not np.array_equal(
        group_data['num_kept_rows'], num_rows):
      raise ValueError(
          'Users that train from their own rows keep every row they '
          'trained; this group kept fewer (kept_rows of a store whose '
          'trains_from_rows is False).'
      )
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
