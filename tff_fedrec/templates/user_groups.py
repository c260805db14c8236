"""Groups of users simulated by one TFF client (numpy, program side).

TFF costs about 1 ms per client per round whatever the client does (measured
on this machine), and one user's local training is a chain of tiny TF ops.
So the simulation lets one TFF client train a group of U users at once
(`local_training.train_users_locally`): each user keeps its own parameters,
data, seed and upload, and the aggregators weight the group's mean upload by
U, so a round gives the same result for any group size (tested), while the
TF ops and the TFF client are shared by U users. On devices, U = 1.

A group's client data (`local_item_training.client_data_type`; the tiered
processes add their own fields to it):
  row_ids      int32 [U, T]  the user's compact item table: global ids of the
                              distinct items in its data (padded with 0);
  num_rows     int32 [U]     T_u, the real rows;
  items        int32 [U, N]  each example's row in the user's compact table
                              (padded with 0);
  labels       float32 [U, N];
  num_examples int32 [U]     n_u, the real examples;
  seeds        int64 [U, 2]  the user's shuffle / noise seed.

Users are grouped by number of examples so a group pads little, and never
across keys (a method's tiers, whose models differ): `run_round` reads the
groups' client state from the program's `client_state_store` and writes it
back.
"""

import collections
from collections.abc import Sequence

import numpy as np

from tff_fedrec.templates import two_phase


def group_positions(
    num_examples: Sequence[int], users_per_group: int, keys=None
) -> list[np.ndarray]:
  """Positions 0..n-1 of the round's users, in groups of at most
  `users_per_group`, users of similar example counts together; with `keys`
  (int [n]), each group holds users of one key, groups of smaller keys
  first."""
  if users_per_group < 1:
    raise ValueError(
        f'users_per_group must be at least 1; got {users_per_group}.'
    )
  num_examples = np.asarray(num_examples)
  if keys is None:
    keys = np.zeros(num_examples.shape, np.int64)
  groups = []
  for key in np.unique(keys):
    positions = np.flatnonzero(np.asarray(keys) == key)
    order = positions[np.argsort(num_examples[positions], kind='stable')]
    groups += [
        order[start : start + users_per_group]
        for start in range(0, order.size, users_per_group)
    ]
  return groups


def pad_rows(arrays: Sequence[np.ndarray], dtype) -> np.ndarray:
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
      row_ids=pad_rows(row_ids, np.int32),
      num_rows=np.array([ids.size for ids in row_ids], np.int32),
      items=pad_rows(local_items, np.int32),
      labels=pad_rows(
          [np.asarray(d['labels'], np.float32) for d in user_data], np.float32
      ),
      num_examples=np.array([len(d['items']) for d in user_data], np.int32),
      **({'seeds': np.stack([np.asarray(d['seed'], np.int64)
                             for d in user_data])}
         if 'seed' in user_data[0] else {}),
  )


def run_round(
    process,
    server_state,
    store,
    users: np.ndarray,
    user_data: Sequence[collections.OrderedDict],
    *,
    users_per_group: int,
    keys=None,
    make_group_data=None,
):
  """One round (`two_phase.run_round`) over the round's users, U per TFF
  client, their client state read from and written back to `store`.

  Args:
    process: A `two_phase.TwoPhaseProcess` with client state.
    server_state: Its server state.
    store: The `client_state_store.ClientStateStore` of every user.
    users: int [n], the round's users.
    user_data: Per user (same order), `OrderedDict(items, labels, seed,
      ...)`.
    users_per_group: U, the users one TFF client simulates.
    keys: int [n] or None; a group's users share a key (`group_positions`).
    make_group_data: positions -> the group's client data; None means
      `group_client_data` of their `user_data`.

  Returns:
    (server_state, the round's metrics).
  """
  users = np.asarray(users)
  if make_group_data is None:
    make_group_data = lambda positions: group_client_data(
        [user_data[p] for p in positions]
    )
  groups = group_positions(
      [len(d['items']) for d in user_data], users_per_group, keys
  )
  group_data = [make_group_data(positions) for positions in groups]
  group_states = [
      store.stacked_local_parameters(users[positions]) for positions in groups
  ]
  server_state, group_states, metrics = two_phase.run_round(
      process, server_state, group_states, group_data
  )
  for positions, data, state in zip(groups, group_data, group_states):
    store.put_group(users[positions], state, data['num_rows'])
  return server_state, metrics
