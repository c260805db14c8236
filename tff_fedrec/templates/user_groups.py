"""Groups of users simulated by one TFF client (numpy, program side).

TFF costs about 1 ms per client per round whatever the client does (measured
on this machine), and one user's local training is a chain of tiny TF ops.
So the simulation lets one TFF client train a group of U users at once: each
user keeps its own parameters, data, seed and upload, and the aggregators
weight the group's mean upload by U, so a round gives the same result for
any group size (tested for every method), while the TF ops and the TFF
client are shared by U users. On devices, U = 1.

A group's client data is the method's (`make_group_data`): each user's
arrays padded to the group's largest (`pad_rows`) with the real sizes
beside them. Users are grouped by their number of examples so a group pads
little, and never across keys (a method's tiers, whose models differ):
`run_round` reads the groups' client state from the program's
`client_state_store` and writes it back (`ClientStateStore.put_group`).
"""

from collections.abc import Sequence
import threading

import numpy as np

from tff_fedrec import one_ahead
from tff_fedrec.templates import cohorts as cohorts_lib
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
  """[len(arrays), the longest's length, ...]: each array's rows, padded
  with zeros."""
  width = max((a.shape[0] for a in arrays), default=0)
  padded = np.zeros([len(arrays), width, *arrays[0].shape[1:]], dtype)
  for index, array in enumerate(arrays):
    padded[index, : array.shape[0]] = array
  return padded


def run_round(
    process,
    server_state,
    store,
    users: np.ndarray,
    *,
    sizes: Sequence[int],
    make_group_data,
    users_per_group: int,
    keys=None,
    observe_uploads=None,
    cohort_size=None,
):
  """One round (`two_phase.run_round`) over the round's users, U per TFF
  client, their client state read from and written back to `store`.

  Args:
    process: A `two_phase.TwoPhaseProcess` with client state.
    server_state: Its server state.
    store: The `client_state_store.ClientStateStore` of every user.
    users: int [n], the round's users.
    sizes: Per user (same order), its number of examples (users of similar
      sizes share a group).
    make_group_data: positions in `users` -> that group's client data.
    users_per_group: U, the users one TFF client simulates.
    keys: int [n] or None; a group's users share a key (`group_positions`).
    observe_uploads: None, or called with [(group's positions, its client
      data, its upload)] of the round, before the server step.
    cohort_size: None, or at most this many users (a multiple of
      `users_per_group`, at least one group) are trained at once: the
      round runs in cohorts (`cohorts`), each cohort's data made when its
      turn comes and its new states stored as it finishes. Ignored where
      the round must run as two steps (`observe_uploads`, or a context that
      spreads clients over executors).

  Returns:
    (server_state, the round's metrics).
  """
  users = np.asarray(users)
  groups = group_positions(sizes, users_per_group, keys)
  groups_per_cohort = (
      len(groups) if cohort_size is None
      else max(1, cohort_size // users_per_group)
  )
  if (groups_per_cohort < len(groups) and observe_uploads is None
      and not two_phase.context_splits_clients()):
    return _run_in_cohorts(process, server_state, store, users, groups,
                           make_group_data, groups_per_cohort)
  group_data = [make_group_data(positions) for positions in groups]
  group_states = [
      store.stacked_local_parameters(users[positions]) for positions in groups
  ]
  observe = None
  if observe_uploads is not None:
    observe = lambda uploads: observe_uploads(
        list(zip(groups, group_data, uploads)))
  server_state, group_states, metrics = two_phase.run_round(
      process, server_state, group_states, group_data, observe
  )
  for positions, data, state in zip(groups, group_data, group_states):
    store.put_group(users[positions], state, data)
  return server_state, metrics


def _run_in_cohorts(process, server_state, store, users, groups,
                    make_group_data, groups_per_cohort):
  """The round in cohorts; the next cohort's inputs are made on a thread
  while the worker trains the current one (`one_ahead`), the store read
  and written under one lock."""
  cohorts = [groups[start : start + groups_per_cohort]
             for start in range(0, len(groups), groups_per_cohort)]
  store_lock = threading.Lock()

  def cohort_inputs(cohort):
    with store_lock:
      return ([store.stacked_local_parameters(users[positions])
               for positions in cohort],
              [make_group_data(positions) for positions in cohort])

  def put_results(index, group_data, group_states):
    with store_lock:
      for positions, data, state in zip(cohorts[index], group_data,
                                        group_states):
        store.put_group(users[positions], state, data)

  return cohorts_lib.run_round(
      process, server_state,
      one_ahead.one_ahead((cohort_inputs(cohort) for cohort in cohorts),
                          thread_name='next-cohort'),
      put_results)

