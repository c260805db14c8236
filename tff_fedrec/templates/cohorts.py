"""A round's clients in cohorts of bounded size, their uploads reduced as
each cohort finishes.

TFF's compiler cuts a computation at its aggregations into up_to_merge /
merge / after_merge (`tff.backends.native.compile_to_mergeable_comp_form`,
the form TFF's mergeable context runs sub-rounds with): up_to_merge
accumulates some clients' values into a partial aggregate A@SERVER, merge
joins two partials, after_merge reports and finishes from the merged one.
Applied to the server step of a `two_phase.TwoPhaseProcess` (whose
aggregation factories already split into accumulate / merge / report), it
gives a round in cohorts:

  cohort_step: (<S@SERVER, {L}@CLIENTS, {D}@CLIENTS> -> <{L'}@CLIENTS, A@SERVER>)
               the client step, then up_to_merge of its uploads: one
               computation, so the uploads never leave the worker;
  merge:       (<A, A> -> A), on the partial aggregates (the size of the
               server's aggregate, not of the clients);
  finish:      after_merge(<S, no clients>, A) -> <S'@SERVER, M@SERVER>.

The program and the worker hold one cohort's inputs and results at a time
(two with two lanes, below), so peak memory follows the cohort size, not
the clients per round. The aggregate is the same sum taken in another order
(cohort by cohort), so a round's figures agree with one computation's to
float rounding, not bit for bit.

Two lanes: a TFF execution context runs one computation at a time (its
Python remote executor blocks in gRPC inside the context's event loop), so
the program serialising one cohort's inputs and storing its outputs and the
worker training it take turns. Where the context's owner allows it
(`allow_two_lanes`: the program's own local worker), a second thread with a
second context on the same worker takes the next cohort meanwhile (TFF's
context stack is per thread). Cohorts are numbered as they are taken, their
states stored and their partial aggregates merged in that order, so the
figures are those of one lane to the bit; a lane runs at most one cohort
ahead of the one being stored. Measured (docs/results/scale.md): PFedRec
ML-1M 3.14 -> 2.87 s a round, FedMF 2.51 -> 2.27 s.

Example:
  >>> round_ = cohort_round(process)
  >>> partial = None
  >>> for locals_, data in cohorts:
  ...   new_locals, part = round_.step(state, locals_, data)
  ...   partial = round_.merge(partial, part)
  >>> state, metrics = round_.finish(state, partial)
"""

import itertools
import threading
from typing import Callable, Optional
import weakref

import tensorflow_federated as tff

from tff_fedrec.templates import two_phase


# A cohort's users of the program's default: 256 users (PFedRec ML-1M:
# 3.2 GB at most), fewer where their client state passes 64 MiB (FedRAS on
# ML-1M keeps 474 KB of item table per user: 128, which took its worker
# from 3.2 to 2.0 GB and its run from 8.1 to 6.9 GB at the same seconds,
# docs/results/scale.md).
DEFAULT_COHORT_SIZE = 256
DEFAULT_COHORT_STATE_BYTES = 64 << 20
_SMALLEST_BOUNDED_COHORT = 32


def bounded_cohort_size(cohort_size: Optional[int], state_bytes_per_user: float,
                        state_bytes: Optional[int]) -> Optional[int]:
  """`cohort_size`, or fewer users when their client state would pass
  `state_bytes`: the largest power of two (at least 32) of users whose
  state fits. None (every user at once) and a `state_bytes` of None or 0
  leave `cohort_size` as it is."""
  if (cohort_size is None or not state_bytes
      or cohort_size * state_bytes_per_user <= state_bytes):
    return cohort_size
  fitting = max(1, int(state_bytes // state_bytes_per_user))
  return min(cohort_size,
             max(_SMALLEST_BOUNDED_COHORT, 1 << (fitting.bit_length() - 1)))


class CohortsUnsupportedError(ValueError):
  """The process's server step cannot be cut at its aggregations."""


class CohortRound:
  """The three computations of a round in cohorts (module docstring)."""

  def __init__(self, process: two_phase.TwoPhaseProcess):
    try:
      form = tff.backends.native.compile_to_mergeable_comp_form(
          process.server_step
      )
    except (ValueError, TypeError) as error:
      raise CohortsUnsupportedError(
          'This method\'s server step cannot run in cohorts (TFF cannot cut '
          f'it at its aggregations: {error}); leave --cohort_size unset.'
      ) from error
    state_type, local_type, data_type = (
        process.client_step.type_signature.parameter
    )

    @tff.federated_computation(state_type, local_type, data_type)
    def cohort_step(server_state, local_states, client_data):
      new_locals, uploads = process.client_step(
          server_state, local_states, client_data
      )
      return new_locals, form.up_to_merge(server_state, uploads)

    self._cohort_step = cohort_step
    self._merge = form.merge
    self._after_merge = form.after_merge

  def step(self, server_state, local_states, client_data):
    """One cohort: (its new client states in client order, its partial
    aggregate)."""
    new_locals, partial = self._cohort_step(
        server_state, list(local_states), list(client_data)
    )
    return list(new_locals), partial

  def merge(self, merged, partial):
    """`partial` joined to `merged` (None before the first cohort)."""
    if merged is None:
      return partial
    return self._merge(merged, partial)

  def finish(self, server_state, merged):
    """(new server state, metrics) from the merged aggregate of every
    cohort."""
    return self._after_merge((server_state, []), merged)


_ROUNDS = weakref.WeakKeyDictionary()


def cohort_round(process: two_phase.TwoPhaseProcess) -> CohortRound:
  """`process`'s `CohortRound`, compiled once per process."""
  if process not in _ROUNDS:
    _ROUNDS[process] = CohortRound(process)
  return _ROUNDS[process]


# Contexts whose rounds may take a second lane: context -> a function
# making the second lane's context, and the second context once made.
_SECOND_CONTEXT_MAKERS = weakref.WeakKeyDictionary()
_SECOND_CONTEXTS = weakref.WeakKeyDictionary()


def allow_two_lanes(context, make_second_context: Callable[[], object]
                    ) -> None:
  """Lets rounds in cohorts run under `context` take a second lane through
  `make_second_context()` (module docstring): another TFF context on the
  same executor, made when a round first needs it."""
  _SECOND_CONTEXT_MAKERS[context] = make_second_context


def _second_context(context) -> Optional[object]:
  """The second lane's context of `context`, or None if it has none."""
  make = _SECOND_CONTEXT_MAKERS.get(context)
  if make is None:
    return None
  if context not in _SECOND_CONTEXTS:
    _SECOND_CONTEXTS[context] = make()
  return _SECOND_CONTEXTS[context]


def run_round(process, server_state, cohorts, put_results, *,
              lanes: Optional[int] = None):
  """One round of `process` over `cohorts`.

  Args:
    process: A `two_phase.TwoPhaseProcess`.
    server_state: Its server state.
    cohorts: An iterable of (client states, client data) pairs, each made
      when its turn comes (a generator keeps one cohort in memory).
    put_results: Called with (cohort index, its client data, its new
      client states) as each cohort finishes, in cohort order, from the
      calling thread.
    lanes: 1 runs the cohorts one after another; 2 on two lanes (module
      docstring); None: two where the current context allows it.

  Returns:
    (new server state, metrics), as `process.next` returns them.
  """
  round_ = cohort_round(process)
  second = None
  if lanes is None or lanes == 2:
    second = _second_context(tff.framework.get_context_stack().current)
    if lanes == 2 and second is None:
      raise ValueError('This context allows one lane (`allow_two_lanes`).')
  elif lanes != 1:
    raise ValueError(f'lanes must be 1, 2 or None; got {lanes}.')
  if second is None:
    merged = None
    for index, (local_states, client_data) in enumerate(cohorts):
      new_locals, partial = round_.step(server_state, local_states,
                                        client_data)
      put_results(index, client_data, new_locals)
      del local_states, client_data, new_locals
      merged = round_.merge(merged, partial)
  else:
    merged = _two_lanes(round_, server_state, cohorts, put_results, second)
  if merged is None:
    raise ValueError('A round in cohorts needs at least one cohort.')
  return round_.finish(server_state, merged)


def _two_lanes(round_, server_state, cohorts, put_results, second_context):
  """The cohorts on this thread and on a second one through
  `second_context`; returns the merged partial aggregate (None for no
  cohorts). The caller stores and merges in cohort order; it takes a new
  cohort only when no result waits for the other lane's, so at most two
  cohorts are in flight and one waits. An error of either lane is raised
  here; after an error no lane takes another cohort."""
  source = iter(cohorts)
  numbers = itertools.count()
  taking = threading.Lock()
  changed = threading.Condition()
  results, errors = {}, []
  stop = threading.Event()
  context_stack = tff.framework.get_context_stack()

  def take():
    with taking:
      if stop.is_set():
        return None
      item = next(source, None)
      return None if item is None else (next(numbers), item)

  def second_lane():
    context_stack.set_default_context(second_context)
    try:
      while (taken := take()) is not None:
        index, (local_states, client_data) = taken
        result = round_.step(server_state, local_states, client_data)
        del local_states
        with changed:
          results[index] = (client_data, result)
          changed.notify_all()
    except BaseException as error:  # pylint: disable=broad-except
      stop.set()
      with changed:
        errors.append(error)
        changed.notify_all()

  lane = threading.Thread(target=second_lane, name='second-lane',
                          daemon=True)
  merged = None
  stored = 0

  def store_ready(wait_while):
    """Stores results in cohort order while the next is there; first waits
    (interruptibly) while `wait_while()`."""
    nonlocal merged, stored
    while True:
      with changed:
        while not errors and wait_while():
          changed.wait(0.1)
        if errors:
          raise errors[0]
        if stored not in results:
          return
        client_data, (new_locals, partial) = results.pop(stored)
      put_results(stored, client_data, new_locals)
      del client_data, new_locals
      merged = round_.merge(merged, partial)
      stored += 1

  lane.start()
  try:
    while True:
      # No result waits for the other lane's cohort before this one takes
      # another: two cohorts in flight, one waiting, at most.
      store_ready(lambda: bool(results) and stored not in results)
      taken = take()
      if taken is None:
        break
      index, (local_states, client_data) = taken
      result = round_.step(server_state, local_states, client_data)
      del local_states
      with changed:
        results[index] = (client_data, result)
      store_ready(lambda: False)
    # The other lane's last cohort.
    while lane.is_alive() or stored in results:
      store_ready(lambda: stored not in results and lane.is_alive())
  finally:
    stop.set()
  if errors:  # The other lane failed and ended before the loop saw it.
    raise errors[0]
  if results:
    raise RuntimeError(
        f'Cohorts {sorted(results)} finished but were not stored.')
  return merged
