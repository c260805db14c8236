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
The merging is `personal_rows.OwnTableStore`'s, with these scales.

Example:
  >>> store = PersonalTableStore(num_users, initial_state, initial_table)
  >>> store.table_vectors(np.array([0]), np.array([[3, 5]]))  # [1, 2, d]
"""

import collections

import numpy as np

from tff_fedrec.algorithms.local_items import personal_rows


class PersonalTableStore(personal_rows.OwnTableStore):
  """Client states of `num_users` users whose D^(i) starts at
  `initial_table` [I, d] (module docstring). `initial_state` is one user's
  `OrderedDict(local_parameters=<..., untrained_row_scale,
  round_row_scale>, personal_item_ids=int32[0], personal_item_rows=
  float32[0, d])`."""

  def __init__(self, num_users: int, initial_state: collections.OrderedDict,
               initial_table: np.ndarray):
    super().__init__(
        num_users, initial_state, initial_table,
        untrained_scale_key='untrained_row_scale',
        round_scale_key='round_row_scale',
    )
