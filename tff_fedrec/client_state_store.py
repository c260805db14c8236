"""The program-side store of every user's client state between rounds.

A TFF `IterativeProcess` is stateless about clients: the program passes each
sampled client's state into `next` and writes the returned state back here.

Layout (memory per user, see `bytes_per_user`):
- local parameters (score function, user embedding): one numpy array per leaf,
  stacked over users, [num_users, ...];
- personal item rows (dual personalization): per user, the ids [T_u] and rows
  [T_u, d] of the item embedding rows the user fine-tuned in its last round.

`to_arrays` / `from_arrays` pack everything into flat numpy arrays (CSR for
the personal rows) for checkpointing.
"""

import collections
from collections.abc import Sequence

import numpy as np
import tensorflow as tf


class ClientStateStore:
  """Client states of `num_users` users, all starting at `initial_state`.

  `initial_state` is an `OrderedDict(local_parameters=..., personal_item_ids=
  int32[0], personal_item_rows=float32[0, d])` as made by
  `partially_local.initial_client_state`.
  """

  def __init__(self, num_users: int, initial_state: collections.OrderedDict):
    self._num_users = num_users
    self._local_structure = initial_state['local_parameters']
    self._local_leaves = [
        np.repeat(np.asarray(leaf)[None], num_users, axis=0)
        for leaf in tf.nest.flatten(self._local_structure)
    ]
    self._embedding_dim = np.asarray(initial_state['personal_item_rows']).shape[1]
    self._personal_ids = [np.zeros([0], np.int32)] * num_users
    self._personal_rows = [
        np.zeros([0, self._embedding_dim], np.float32)
    ] * num_users
    self._row_index = None

  @property
  def num_users(self) -> int:
    return self._num_users

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
    """The local parameters of `users`, in order: the input of `next`."""
    return [
        tf.nest.pack_sequence_as(
            self._local_structure, [leaf[user] for leaf in self._local_leaves]
        )
        for user in users
    ]

  def put(self, users: Sequence[int], states: Sequence) -> None:
    """Stores the states returned by a round for `users` (same order)."""
    for user, state in zip(users, states, strict=True):
      for leaf_store, leaf in zip(
          self._local_leaves, tf.nest.flatten(state['local_parameters'])
      ):
        leaf_store[user] = leaf
      self._personal_ids[user] = np.asarray(
          state['personal_item_ids'], np.int32
      )
      self._personal_rows[user] = np.asarray(
          state['personal_item_rows'], np.float32
      )
    self._row_index = None

  def put_local_parameters(self, users: np.ndarray, stacked) -> None:
    """Sets the local parameters of `users` from arrays with a leading user
    dimension (the inverse of `stacked_local_parameters`); personal rows
    stay as they are."""
    for leaf_store, leaf in zip(self._local_leaves, tf.nest.flatten(stacked)):
      leaf_store[users] = leaf

  def stacked_local_parameters(self, users: np.ndarray):
    """Local parameters of `users` with a leading user dimension [U, ...]."""
    return tf.nest.pack_sequence_as(
        self._local_structure, [leaf[users] for leaf in self._local_leaves]
    )

  def _personal_row_index(self, num_items: int):
    """(sorted keys user * num_items + item, their rows), built once per put."""
    if self._row_index is None or self._row_index[0] != num_items:
      counts = np.array([ids.size for ids in self._personal_ids], np.int64)
      owner = np.repeat(np.arange(self._num_users, dtype=np.int64), counts)
      keys = owner * num_items + np.concatenate(self._personal_ids)
      rows = np.concatenate(self._personal_rows).reshape(
          [-1, self._embedding_dim]
      )
      order = np.argsort(keys, kind='stable')
      self._row_index = (num_items, keys[order], rows[order])
    return self._row_index[1:]

  def item_vectors(
      self, users: np.ndarray, items: np.ndarray, item_embedding: np.ndarray
  ) -> np.ndarray:
    """Each user's view of `items` [U, C]: personal row if any, else global.

    Returns float32 [U, C, d].
    """
    vectors = item_embedding[items]
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
    total = sum(leaf.nbytes for leaf in self._local_leaves)
    total += sum(ids.nbytes for ids in self._personal_ids)
    total += sum(rows.nbytes for rows in self._personal_rows)
    return total / self._num_users

  def to_arrays(self) -> collections.OrderedDict:
    """Flat numpy arrays holding the whole store (for checkpoints)."""
    counts = np.array([ids.size for ids in self._personal_ids], np.int64)
    return collections.OrderedDict(
        local_leaves=[leaf.copy() for leaf in self._local_leaves],
        personal_offsets=np.concatenate([[0], np.cumsum(counts)]),
        personal_ids=np.concatenate(self._personal_ids),
        personal_rows=np.concatenate(self._personal_rows).reshape(
            [-1, self._embedding_dim]
        ),
    )

  def load_arrays(self, arrays) -> None:
    """Restores the store from `to_arrays` output."""
    leaves = [np.asarray(leaf) for leaf in arrays['local_leaves']]
    if [l.shape for l in leaves] != [l.shape for l in self._local_leaves]:
      raise ValueError(
          'Checkpointed client states do not match this model: local '
          f'parameter shapes {[l.shape for l in leaves]} vs '
          f'{[l.shape for l in self._local_leaves]}.'
      )
    self._local_leaves = [leaf.copy() for leaf in leaves]
    offsets = np.asarray(arrays['personal_offsets'])
    ids = np.asarray(arrays['personal_ids'], np.int32)
    rows = np.asarray(arrays['personal_rows'], np.float32).reshape(
        [-1, self._embedding_dim]
    )
    self._personal_ids = [
        ids[offsets[u] : offsets[u + 1]] for u in range(self._num_users)
    ]
    self._personal_rows = [
        rows[offsets[u] : offsets[u + 1]] for u in range(self._num_users)
    ]
    self._row_index = None
