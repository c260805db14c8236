"""One process with client state, composed from its four roles.

Every stateful method of this project is built here, as TFF's `learning.templates.composers.compose_learning_process` builds a
`LearningProcess`, from

  distributor   a `roles.Distributor`: what the server sends
                (`distributors.Broadcast`, or a method's own);
  client work   a `roles.ClientWork`: a `tff.tensorflow.computation`
                  client_update: (<B, L, D> -> <L', <update, weight, metrics>>)
                that trains a group of users from what it received (B), their
                client state (L) and data (D), and returns their new state and
                the group's upload;
  aggregator    a `tff.templates.AggregationProcess` (from a factory of
                `tff.aggregators` or `tff_fedrec.aggregators`) taking the
                uploads' `update` and `weight`;
  finalizer     a `roles.Finalizer`: the server's step from the aggregate
                (`finalizers.ApplyDelta`, an optimizer step, or a method's
                own).

The roles are checked against each other first (`roles.check_roles`): a
role that lacks a member, or a client work that cannot take what the
distributor sends, fails with a TypeError before anything is traced.

The result is a `two_phase.TwoPhaseProcess` (a round is a client step and a
server step, so several executors train each client once):

  initialize: ( -> S@SERVER)
  next: (<S@SERVER, {L}@CLIENTS, {D}@CLIENTS> -> <S@SERVER, {L'}@CLIENTS, M@SERVER>)

  S = <global_parameters, distributor, aggregator, finalizer, round_num>
  M = <train_loss, num_examples, client_work, aggregator, finalizer,
       distributor>

where `client_work` is the clients' `metrics` summed (each must hold
`loss_sum` and `num_examples`; the training loss is their ratio) and the
other three are the roles' measurements.

Unlike TFF's `DistributionProcess`, a distributor acts twice per round:
`distribute` in the client step, and `record` in the server step, after the
finalizer, so that a downlink codec can encode the round's aggregate.

Example (a broadcast, a sum and an identity finalizer):
  >>> process = compose_client_state_process(
  ...     initial_global_parameters=initial, distributor=distributors.Broadcast(),
  ...     client_work=roles.client_work(client_update),
  ...     aggregator=tff.aggregators.SumFactory().create(update_type),
  ...     finalizer=finalizers.ApplyDelta())
"""

import collections

import numpy as np
import tensorflow_federated as tff

from tff_fedrec.templates import roles
from tff_fedrec.templates import two_phase


def _train_loss(client_metrics):
  """(train loss, examples)@SERVER from the summed client metrics."""
  return (
      two_phase.server_ratio(
          client_metrics.loss_sum, client_metrics.num_examples
      ),
      client_metrics.num_examples,
  )


def compose_client_state_process(
    *,
    initial_global_parameters: tff.Computation,
    distributor: roles.Distributor,
    client_work: roles.ClientWork,
    aggregator: tff.templates.AggregationProcess,
    finalizer: roles.Finalizer,
) -> two_phase.TwoPhaseProcess:
  """Builds the process of the module docstring.

  Args:
    initial_global_parameters: A `tff.tensorflow.computation` ( -> G), the
      server's initial global parameters (an empty structure if there are
      none).
    distributor: The `roles.Distributor`.
    client_work: The `roles.ClientWork`.
    aggregator: A weighted `tff.templates.AggregationProcess` of the
      uploads' `update` (next: <state, {update}@CLIENTS, {weight}@CLIENTS>).
    finalizer: The `roles.Finalizer`.

  Returns:
    A `two_phase.TwoPhaseProcess`.

  Raises:
    TypeError: for roles that do not fit together (`roles.check_roles`).
  """
  roles.check_roles(
      initial_global_parameters=initial_global_parameters,
      distributor=distributor, client_work=client_work,
      aggregator=aggregator, finalizer=finalizer,
  )
  update_type = client_work.client_update.type_signature

  @tff.federated_computation
  def initialize():
    return tff.federated_zip(
        collections.OrderedDict(
            global_parameters=tff.federated_eval(
                initial_global_parameters, tff.SERVER
            ),
            distributor=tff.federated_eval(
                distributor.initial_state, tff.SERVER
            ),
            aggregator=aggregator.initialize(),
            finalizer=tff.federated_eval(finalizer.initial_state, tff.SERVER),
            round_num=tff.federated_value(np.int32(0), tff.SERVER),
        )
    )

  server_state_type = initialize.type_signature.result

  @tff.federated_computation(
      server_state_type,
      tff.FederatedType(update_type.parameter[1], tff.CLIENTS),
      tff.FederatedType(update_type.parameter[2], tff.CLIENTS),
  )
  def client_step(server_state, local_states, client_data):
    return tff.federated_map(
        client_work.client_update,
        (distributor.distribute(server_state), local_states, client_data),
    )

  @tff.federated_computation(
      server_state_type,
      tff.FederatedType(update_type.result[1], tff.CLIENTS),
  )
  def server_step(server_state, uploads):
    aggregated = aggregator.next(
        server_state.aggregator, uploads.update, uploads.weight
    )
    finalizer_state, new_global, finalizer_measurements = finalizer.finalize(
        server_state.finalizer, server_state.global_parameters,
        aggregated.result, server_state.round_num,
    )
    distributor_state, distributor_measurements = distributor.record(
        server_state.distributor, aggregated.result, new_global,
        server_state.round_num,
    )
    client_metrics = tff.federated_sum(uploads.metrics)
    train_loss, num_examples = _train_loss(client_metrics)
    metrics = tff.federated_zip(
        collections.OrderedDict(
            train_loss=train_loss,
            num_examples=num_examples,
            client_work=client_metrics,
            aggregator=aggregated.measurements,
            finalizer=finalizer_measurements,
            distributor=distributor_measurements,
        )
    )
    new_server_state = tff.federated_zip(
        collections.OrderedDict(
            global_parameters=new_global,
            distributor=distributor_state,
            aggregator=aggregated.state,
            finalizer=finalizer_state,
            round_num=two_phase.next_round_num(server_state.round_num),
        )
    )
    return new_server_state, metrics

  return two_phase.TwoPhaseProcess(initialize, client_step, server_step)
