"""Processes with client state whose round is two TFF computations.

Every process of this package returns client state ({L}@CLIENTS). Under
TFF's mergeable-computation context, which spreads the clients over several
executors (`programs/execution.remote_workers_context`), a computation is
cut at its aggregation into up_to_merge / merge / after_merge, and a
client-placed result can come only from after_merge, which sees the original
argument and the merged aggregate but not up_to_merge's client results: the
client work runs twice. So a round is two computations:

  client_step: (<S@SERVER, {L}@CLIENTS, {D}@CLIENTS> -> <{L}@CLIENTS, {U}@CLIENTS>)
  server_step: (<S@SERVER, {U}@CLIENTS> -> <S@SERVER, M@SERVER>)

The first has no aggregation, so each executor trains its share of the
clients once; the second aggregates the uploads U. `next` composes the two,
so the process keeps the one-computation signature

  next: (<S@SERVER, {L}@CLIENTS, {D}@CLIENTS> -> <S@SERVER, {L}@CLIENTS, M@SERVER>)

and `run_round` runs the two steps from Python under that context (U crosses
the program: on ML-100K with `user_groups`, PFedRec's row-sparse uploads are
about 48 MB a round, and crossing twice took 0.5 s of its 1.6 s round).
TFF 0.87's mergeable context concatenates the sub-rounds' client-placed
results in the order the executors finish, not in client order, so
`run_round` sends each client's index along and puts the results back in
order. In any other context (one executor: the local worker, TFF's test
context) `run_round` calls `next`, one computation whose uploads never leave
the worker, unless the caller asks to see the uploads.

`composer.compose_client_state_process` builds every process of this
project from its roles as such a pair of steps.

Example:
  >>> process = TwoPhaseProcess(initialize, client_step, server_step)
  >>> state, new_locals, metrics = run_round(process, state, locals, data)
"""

from collections.abc import Callable, Sequence
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


class TwoPhaseProcess(tff.templates.IterativeProcess):
  """An `IterativeProcess` whose `next` is `client_step` then `server_step`.

  Attributes:
    client_step: The client work, no aggregation (module docstring).
    server_step: The aggregation of the uploads and the server update.
    indexed_client_step: `client_step` taking and returning each client's
      index as well: (<S@SERVER, {L}@CLIENTS, {D}@CLIENTS, {int32}@CLIENTS>
      -> <{L}@CLIENTS, {U}@CLIENTS, {int32}@CLIENTS>).
  """

  def __init__(
      self,
      initialize_fn: tff.Computation,
      client_step: tff.Computation,
      server_step: tff.Computation,
  ):
    state_type, local_type, data_type = client_step.type_signature.parameter

    @tff.federated_computation(state_type, local_type, data_type)
    def next_fn(server_state, local_states, client_data):
      new_locals, uploads = client_step(server_state, local_states, client_data)
      new_state, metrics = server_step(server_state, uploads)
      return new_state, new_locals, metrics

    @tff.federated_computation(
        state_type, local_type, data_type,
        tff.FederatedType(np.int32, tff.CLIENTS),
    )
    def indexed_client_step(server_state, local_states, client_data, index):
      new_locals, uploads = client_step(server_state, local_states, client_data)
      return new_locals, uploads, index

    super().__init__(initialize_fn, next_fn)
    self.client_step = client_step
    self.server_step = server_step
    self.indexed_client_step = indexed_client_step


def run_round(
    process: TwoPhaseProcess,
    server_state,
    local_states: Sequence,
    client_data: Sequence,
    observe_uploads: Optional[Callable[[list], None]] = None,
):
  """`process.next` as its two steps; returns (state, new locals in client
  order, metrics). `observe_uploads`, if given, is called with the clients'
  uploads (in client order) between the two steps: what each client sent,
  for a program that studies it (what a codec would lose of it, say)."""
  if observe_uploads is None and not context_splits_clients():
    server_state, new_locals, metrics = process.next(
        server_state, list(local_states), list(client_data)
    )
    return server_state, list(new_locals), metrics
  indices = [np.int32(i) for i in range(len(client_data))]
  new_locals, uploads, returned = process.indexed_client_step(
      server_state, list(local_states), list(client_data), indices
  )
  order = np.argsort(np.asarray(returned, np.int64), kind='stable')
  new_locals = [new_locals[i] for i in order]
  uploads = [uploads[i] for i in order]
  if observe_uploads is not None:
    observe_uploads(uploads)
  server_state, metrics = process.server_step(server_state, uploads)
  return server_state, new_locals, metrics


def context_splits_clients() -> bool:
  """Whether TFF's current context spreads a round's clients over several
  executors (the mergeable context of `programs/execution`'s remote
  workers), where a round must run as its two steps."""
  return isinstance(
      tff.framework.get_context_stack().current,
      tff.framework.MergeableCompExecutionContext,
  )


def server_ratio(numerator, denominator):
  """float32@SERVER: numerator / denominator, both float32@SERVER (0 when
  the denominator is 0)."""
  divide = tff.tensorflow.computation(
      lambda numerator, denominator: tf.math.divide_no_nan(
          numerator, denominator
      ),
      np.float32, np.float32,
  )
  return tff.federated_map(divide, (numerator, denominator))


def next_round_num(round_num):
  """round_num + 1 @SERVER."""
  increment = tff.tensorflow.computation(lambda r: r + 1, np.int32)
  return tff.federated_map(increment, round_num)
