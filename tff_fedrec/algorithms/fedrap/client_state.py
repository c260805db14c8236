"""The program-side store of FedRAP's per-user item tables D^(i).

A dense D^(i) for every user does not fit: ML-1M's 6,040 x 3,706 x 32
float32 would be 2.9 GB. Every user starts from one initial table D_0
(the reference code's template model), so the store keeps D_0 once and,
per user,

  personal rows   the ids and rows of D^(i) it has trained in any round
                  (`client_state_store`'s personal rows, sorted by id);
  untrained_row_scale
                  s_i, a float in its local state: a row it never trained
                  is s_i D_0[j], weight decay having shrunk it (SGD's decay
                  reaches every row, `local_training`);
  round_row_scale what its last round multiplied the rows outside its
                  round's table by.

After a round the user's new rows replace its old ones of the same items,
and its other old rows are multiplied by round_row_scale (`put_group`).
Checkpoints are the base store's arrays; D_0 is rebuilt from the seed.

Example:
  >>> store = PersonalTableStore(num_users, initial_state, initial_table)
  >>> store.personal_vectors(np.array([0]), np.array([[3, 5]]))  # [1, 2, d]
"""

import collections

import numpy as np
import tensorflow as tf

from tff_fedrec import client_state_store


class PersonalTableStore(client_state_store.ClientStateStore):
  """Client states of `num_users` users whose D^(i) starts at
  `initial_table` [I, d] (module docstring). `initial_state` is one user's
  `OrderedDict(local_parameters=<..., untrained_row_scale,
  round_row_scale>, personal_item_ids=int32[0], personal_item_rows=
  float32[0, d])`."""

  def __init__(self, num_users: int, initial_state: collections.OrderedDict,
               initial_table: np.ndarray):
    super().__init__(num_users, initial_state)
    self._initial_table = np.asarray(initial_table, np.float32)

  def personal_vectors(self, users: np.ndarray,
                       items: np.ndarray) -> np.ndarray:
    """D^(u)[items[u]] of each of `users` [U] for `items` int [U, C]:
    float32 [U, C, d]."""
    users = np.asarray(users, np.int64)
    items = np.asarray(items)
    scales = np.asarray(
        self.stacked_local_parameters(users)['untrained_row_scale'],
        np.float32,
    )
    vectors = self._initial_table[items] * scales[:, None, None]
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
    scales = local['round_row_scale']
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
    """Mean bytes per user of client state, D_0's share included."""
    return (super().bytes_per_user()
            + self._initial_table.nbytes / self.num_users)
