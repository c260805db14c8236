"""Groups of users simulated by one TFF client (numpy, program side).

TFF costs about 1 ms per client per round whatever the client does (measured
on this machine), and one user's local training is a chain of tiny TF ops.
So the simulation lets one TFF client train a group of U users at once
(`local_training.train_users_locally`): each user keeps its own parameters,
data, seed and upload, and the aggregators weight the group's mean upload by
U, so a round gives the same result for any group size (tested), while the
TF ops and the TFF client are shared by U users. On devices, U = 1.

A group's client data (`partially_local.client_data_type()`):
  row_ids      int32 [U, T]  the user's compact item table: global ids of the
                              distinct items in its data (padded with 0);
  num_rows     int32 [U]     T_u, the real rows;
  items        int32 [U, N]  each example's row in the user's compact table
                              (padded with 0);
  labels       float32 [U, N];
  num_examples int32 [U]     n_u, the real examples;
  seeds        int64 [U, 2]  the user's shuffle / noise seed.

Users are grouped by number of examples so a group pads little.
"""

import collections
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tff_fedrec.algorithms import two_phase


def group_positions(
    num_examples: Sequence[int], users_per_group: int
) -> list[np.ndarray]:
  """Positions 0..n-1 of the round's users, in groups of at most
  `users_per_group`, users of similar example counts together."""
  if users_per_group < 1:
    raise ValueError(
        f'users_per_group must be at least 1; got {users_per_group}.'
    )
  order = np.argsort(np.asarray(num_examples), kind='stable')
  return [
      order[start : start + users_per_group]
      for start in range(0, order.size, users_per_group)
  ]


def _pad_rows(arrays: Sequence[np.ndarray], dtype) -> np.ndarray:
  width = max((a.shape[0] for a in arrays), default=0)
  padded = np.zeros([len(arrays), width, *arrays[0].shape[1:]], dtype)
  for index, array in enumerate(arrays):
    padded[index, : array.shape[0]] = array
  return padded


def group_client_data(
    user_data: Sequence[collections.OrderedDict],
) -> collections.OrderedDict:
  """One group's client data from its users' `OrderedDict(items, labels,
  seed)` (item ids global); users without a seed give no `seeds`."""
  row_ids, local_items = [], []
  for data in user_data:
    ids, inverse = np.unique(np.asarray(data['items']), return_inverse=True)
    row_ids.append(ids.astype(np.int32))
    local_items.append(inverse.astype(np.int32).reshape(-1))
  return collections.OrderedDict(
      row_ids=_pad_rows(row_ids, np.int32),
      num_rows=np.array([ids.size for ids in row_ids], np.int32),
      items=_pad_rows(local_items, np.int32),
      labels=_pad_rows(
          [np.asarray(d['labels'], np.float32) for d in user_data], np.float32
      ),
      num_examples=np.array([len(d['items']) for d in user_data], np.int32),
      **({'seeds': np.stack([np.asarray(d['seed'], np.int64)
                             for d in user_data])}
         if 'seed' in user_data[0] else {}),
  )


def tier_group_client_data(
    user_data: Sequence[collections.OrderedDict], *, tier: int,
    include: float = 1.0,
) -> collections.OrderedDict:
  """A group's client data for the tiered processes
  (`hetefedrec.client_data_type()`): the model tier it trains, whether its
  uploads count, `group_client_data` of its users, `validation` [U, N], 1
  for the examples a user holds out (its optional `validation` entry; none
  without), and `seeds` [U, 2] (its optional `seed`; (0, 0) without),
  which only minibatch local training reads."""
  validation = _pad_rows(
      [np.asarray(d.get('validation', np.zeros(len(d['items']))),
                  np.float32) for d in user_data],
      np.float32,
  )
  seeded = [collections.OrderedDict(d, seed=d.get('seed', (0, 0)))
            for d in user_data]
  return collections.OrderedDict(
      tier=np.int32(tier), include=np.float32(include),
      **group_client_data(seeded), validation=validation,
  )


def ungroup_states(
    group_state: collections.OrderedDict, num_rows: np.ndarray
) -> list[collections.OrderedDict]:
  """Splits a group's returned client state into its users' states.

  `group_state` holds `local_parameters` with a leading [U] dimension and
  `personal_item_ids` [U, T] / `personal_item_rows` [U, T, d] (T = 0 without
  dual personalization); user u keeps its first num_rows[u] rows.
  """
  ids = np.asarray(group_state['personal_item_ids'])
  rows = np.asarray(group_state['personal_item_rows'])
  states = []
  for user, count in enumerate(np.asarray(num_rows)):
    count = min(int(count), ids.shape[1])
    states.append(
        collections.OrderedDict(
            local_parameters=tf.nest.map_structure(
                lambda leaf, u=user: np.asarray(leaf)[u],
                group_state['local_parameters'],
            ),
            personal_item_ids=ids[user, :count],
            personal_item_rows=rows[user, :count],
        )
    )
  return states


def run_grouped_round(
    process,
    server_state,
    local_parameters,
    user_data: Sequence[collections.OrderedDict],
    users_per_group: int,
):
  """One round (`two_phase.run_round`) over the round's users, U per TFF
  client.

  Args:
    process: A `partially_local` process.
    server_state: Its server state.
    local_parameters: The round's users' local parameters, every leaf with a
      leading dimension over the users (in `user_data`'s order).
    user_data: Per user, `OrderedDict(items, labels, seed)`.
    users_per_group: U, the users one TFF client simulates.

  Returns:
    (server_state, the users' new client states in `user_data`'s order,
    the round's metrics).
  """
  groups = group_positions([len(d['items']) for d in user_data],
                           users_per_group)
  group_data = [group_client_data([user_data[p] for p in g]) for g in groups]
  group_locals = [
      tf.nest.map_structure(lambda leaf, g=g: np.asarray(leaf)[g],
                            local_parameters)
      for g in groups
  ]
  server_state, group_states, metrics = two_phase.run_round(
      process, server_state, group_locals, group_data
  )
  states = [None] * len(user_data)
  for positions, data, group_state in zip(groups, group_data, group_states):
    for position, state in zip(
        positions, ungroup_states(group_state, data['num_rows'])
    ):
      states[position] = state
  return server_state, states, metrics
