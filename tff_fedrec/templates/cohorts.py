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

The program and the worker hold one cohort's inputs and results at a time,
so peak memory follows the cohort size, not the clients per round. The
aggregate is the same sum taken in another order (cohort by cohort), so a
round's figures agree with one computation's to float rounding, not bit for
bit.

Example:
  >>> round_ = cohort_round(process)
  >>> partial = None
  >>> for locals_, data in cohorts:
  ...   new_locals, part = round_.step(state, locals_, data)
  ...   partial = round_.merge(partial, part)
  >>> state, metrics = round_.finish(state, partial)
"""

import weakref

import tensorflow_federated as tff

from tff_fedrec.templates import two_phase


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


def run_round(process, server_state, cohorts, put_results):
  """One round of `process` over `cohorts`, one after another.

  Args:
    process: A `two_phase.TwoPhaseProcess`.
    server_state: Its server state.
    cohorts: An iterable of (client states, client data) pairs, each made
      when its turn comes (a generator keeps one cohort in memory).
    put_results: Called with (cohort index, its client data, its new
      client states) as each cohort finishes.

  Returns:
    (new server state, metrics), as `process.next` returns them.
  """
  round_ = cohort_round(process)
  merged = None
  for index, (local_states, client_data) in enumerate(cohorts):
    new_locals, partial = round_.step(server_state, local_states, client_data)
    put_results(index, client_data, new_locals)
    del local_states, client_data, new_locals
    merged = round_.merge(merged, partial)
  if merged is None:
    raise ValueError('A round in cohorts needs at least one cohort.')
  return round_.finish(server_state, merged)
