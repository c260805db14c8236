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

`to_arrays` / `load_arrays` pack everything into flat numpy arrays (CSR
offsets and values for each ragged field) for checkpointing.

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

from tff_fedrec import csr


class ClientStateStore:
  """Client states of `num_users` users, all starting at `initial_state`.

  Args:
    num_users: U.
    initial_state: One user's stacked state, a nest of arrays (one
      partition holding every user).
    ragged: {name: one user's initial array [T, ...]} of the ragged
      fields (T may be 0); every user starts with that array.
  """

  def __init__(self, num_users: int, initial_state,
               ragged: Optional[Mapping[str, np.ndarray]] = None):
    # np.repeat makes arrays of the store's own: no second copy of them.
    self._init(
        num_users,
        [(np.arange(num_users),
          tf.nest.map_structure(
              lambda leaf: np.repeat(np.asarray(leaf)[None], num_users,
                                     axis=0),
              initial_state,
          ))],
        ragged,
        copy=False,
    )

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
    return store

  def _init(self, num_users, partitions, ragged, *, copy):
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
      leaves = [np.array(leaf, copy=copy)
                for leaf in tf.nest.flatten(local)]
      if any(leaf.shape[:1] != (users.size,) for leaf in leaves):
        raise ValueError(
            f'Partition {index}: every leaf needs a leading dimension of '
            f'{users.size} users.'
        )
      # The nest's structure only: its arrays would be a second store.
      self._structures.append(tf.nest.map_structure(lambda _: 0, local))
      self._leaves.append(leaves)
    if np.any(self._partition_of < 0):
      raise ValueError('Every user must lie in a partition.')
    self._ragged = collections.OrderedDict(
        (name, [np.asarray(initial)] * num_users)
        for name, initial in (ragged or {}).items()
    )

  @property
  def num_users(self) -> int:
    return self._num_users

  @property
  def ragged_fields(self) -> tuple[str, ...]:
    return tuple(self._ragged)

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
            [leaf[position] for leaf in self._leaves[partition]],
        )
        for partition, position in zip(
            self._partition_of[users], self._position[users]
        )
    ]

  def stacked_local_parameters(self, users: np.ndarray):
    """The stacked state of `users` (all of one partition) with a leading
    user dimension [U, ...]."""
    partition, positions = self._partition(users)
    return tf.nest.pack_sequence_as(
        self._structures[partition],
        [leaf[positions] for leaf in self._leaves[partition]],
    )

  def put_local_parameters(self, users: np.ndarray, stacked) -> None:
    """Sets the stacked state of `users` (all of one partition) from
    arrays with a leading user dimension (the inverse of
    `stacked_local_parameters`)."""
    partition, positions = self._partition(users)
    for leaf_store, leaf in zip(
        self._leaves[partition], tf.nest.flatten(stacked)
    ):
      leaf_store[positions] = np.asarray(leaf)

  def put_user_states(self, users: Sequence[int], states: Sequence) -> None:
    """Sets the stacked state of each of `users` from its own nest (no
    leading dimension; the users may lie in several partitions)."""
    users = np.asarray(users, np.int64)
    for partition, position, state in zip(
        self._partition_of[users], self._position[users], states,
        strict=True,
    ):
      for leaf_store, leaf in zip(
          self._leaves[partition], tf.nest.flatten(state)
      ):
        leaf_store[position] = leaf

  def ragged(self, name: str, users: Sequence[int]) -> list[np.ndarray]:
    """Each of `users`' array of ragged field `name`, in order."""
    field = self._ragged[name]
    return [field[user] for user in np.asarray(users, np.int64)]

  def put_ragged(self, name: str, users: Sequence[int],
                 values: Sequence[np.ndarray]) -> None:
    """Sets each of `users`' array of ragged field `name`."""
    field = self._ragged[name]
    dtype = field[0].dtype if field else None
    for user, value in zip(np.asarray(users, np.int64), values, strict=True):
      field[user] = np.asarray(value, dtype)

  def put_group(self, users: np.ndarray, group_state, group_data) -> None:
    """Stores the new state a round's group of `users` returned, given the
    group's client data (`templates.user_groups.run_round` calls this): by
    default the state is the stacked state [U, ...]. A store whose methods
    return more (e.g. ragged rows) says how to keep it."""
    del group_data
    self.put_local_parameters(users, group_state)

  def bytes_per_user(self) -> float:
    """Mean bytes of client state held per user."""
    total = sum(leaf.nbytes for leaves in self._leaves for leaf in leaves)
    total += sum(value.nbytes for field in self._ragged.values()
                 for value in field)
    return total / self._num_users

  def to_arrays(self, *, copy: bool = True) -> collections.OrderedDict:
    """Flat arrays holding the whole store (for checkpoints): the stacked
    leaves, and per ragged field CSR `offsets` [U + 1] and `values` as a
    `csr.ValuesInPieces` (the users' arrays, not a concatenated copy of
    them: `np.asarray` builds it, a checkpoint writes it piece by piece).

    Args:
      copy: False gives the store's own stacked leaves, not copies: for a
        caller that writes them out before the store next changes (a
        checkpoint; FedRAS's users' table copies are 2.9 GB on ML-1M). The
        ragged values are a snapshot either way (a put replaces a user's
        array, never changes it).
    """
    ragged = collections.OrderedDict()
    for name, field in self._ragged.items():
      counts = np.array([len(value) for value in field], np.int64)
      ragged[name] = collections.OrderedDict(
          offsets=np.concatenate([[0], np.cumsum(counts)]),
          values=csr.ValuesInPieces(field),
      )
    return collections.OrderedDict(
        local_leaves=[leaf.copy() if copy else leaf
                      for leaves in self._leaves for leaf in leaves],
        ragged=ragged,
    )

  def load_arrays(self, arrays) -> None:
    """Restores the store from `to_arrays` output."""
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
    for partition in self._leaves:
      for leaf in partition:
        np.copyto(leaf, leaves.pop(0), casting='no')
    for name, field in self._ragged.items():
      offsets = np.asarray(arrays['ragged'][name]['offsets'])
      values = np.asarray(arrays['ragged'][name]['values'], field[0].dtype)
      if offsets.shape != (self._num_users + 1,) or (
          values.shape[1:] != field[0].shape[1:]):
        raise ValueError(
            f'Checkpointed client states do not match this model: {name} '
            f'of {offsets.size - 1} users, rows {values.shape[1:]} (expected '
            f'{self._num_users} users, rows {field[0].shape[1:]}).'
        )
      self._ragged[name] = [
          values[offsets[u] : offsets[u + 1]].copy()
          for u in range(self._num_users)
      ]
