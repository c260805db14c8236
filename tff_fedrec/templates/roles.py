"""The roles a process with client state is composed of, declared.

`composer.compose_client_state_process` builds every stateful process of
this project from four roles, as TFF's `compose_learning_process` builds a
`LearningProcess` from its own four:

  Distributor   what the server sends each round, and what it keeps of
                the round after the finalizer (`distributors.Broadcast`,
                or a method's own: a compressed downlink, a teacher beside
                the model);
  ClientWork    the clients' computation (<B, L, D> -> <L', U>), which
                trains a group of users from what they received (B), their
                client state (L) and data (D);
  aggregation   a `tff.templates.AggregationProcess` of the uploads U,
                made by a `tff.aggregators` factory (no role of its own);
  Finalizer     the server's step from the aggregate
                (`finalizers.ApplyDelta`, `ServerAdam`, `SubtractChanges`,
                or a method's own).

Each is a `typing.Protocol`: any object with these members plays the
role, and the composer checks them, and the types that flow between them,
before it builds anything (`check_roles`).

Example (the client work of one `tff.tensorflow.computation`):
  >>> work = client_work(client_update)
  >>> work.local_state_type, work.data_type, work.upload_type
"""

import collections
import dataclasses
from typing import Protocol, runtime_checkable

import tensorflow as tf
import tensorflow_federated as tff


@runtime_checkable
class Distributor(Protocol):
  """What the server sends, acting twice a round.

  Attributes:
    initial_state: A `tff.tensorflow.computation` ( -> its server state).
  """

  initial_state: tff.Computation

  def received_type(self, global_type: tff.Type) -> tff.Type:
    """B, what a client receives when the global parameters have type
    `global_type`."""

  def distribute(self, server_state):
    """B@CLIENTS, called while tracing the client step; `server_state` is
    the process's <global_parameters, distributor, aggregator, finalizer,
    round_num>@SERVER."""

  def record(self, state, aggregate, new_global, round_num):
    """(new state, measurements), both SERVER-placed, called while tracing
    the server step after the finalizer (a downlink codec encodes the
    round's aggregate here)."""


@runtime_checkable
class ClientWork(Protocol):
  """The clients' computation.

  Attributes:
    client_update: A `tff.tensorflow.computation` (<B, L, D> -> <L', U>)
      with U = <update, weight: float32, metrics: <loss_sum: float32,
      num_examples: float32, ...>>.
  """

  client_update: tff.Computation


@runtime_checkable
class Finalizer(Protocol):
  """The server's step from the aggregate.

  Attributes:
    initial_state: A `tff.tensorflow.computation` ( -> its server state).
  """

  initial_state: tff.Computation

  def finalize(self, state, global_parameters, aggregate, round_num):
    """(new state, new global parameters, measurements), all
    SERVER-placed, called while tracing the server step."""


@dataclasses.dataclass(frozen=True)
class _ClientWork:
  client_update: tff.Computation

  @property
  def local_state_type(self) -> tff.Type:
    return self.client_update.type_signature.parameter[1]

  @property
  def data_type(self) -> tff.Type:
    return self.client_update.type_signature.parameter[2]

  @property
  def upload_type(self) -> tff.Type:
    return self.client_update.type_signature.result[1]


def upload(update, *, users, loss_sum, num_examples, **metrics):
  """TF: a group's upload U = <update, weight, metrics> as the composer
  takes it: the weight is the group's number of users (`users`, an int
  or int tensor), its metrics the loss summed over the examples
  (`loss_sum` [U] or a scalar), the examples (`num_examples` [U] or a
  scalar) and any others (`metrics`, summed over the clients too)."""
  return collections.OrderedDict(
      update=update,
      weight=tf.cast(users, tf.float32),
      metrics=collections.OrderedDict(
          loss_sum=tf.reduce_sum(loss_sum),
          num_examples=tf.cast(tf.reduce_sum(num_examples), tf.float32),
          **metrics,
      ),
  )


def client_work(client_update: tff.Computation) -> ClientWork:
  """The `ClientWork` of one computation (<B, L, D> -> <L', U>), with its
  types as `local_state_type`, `data_type` and `upload_type`."""
  return _ClientWork(client_update)


def _member_names(struct_type) -> list:
  if not isinstance(struct_type, tff.StructType):
    return []
  return [name for name, _ in tff.structure.iter_elements(struct_type)]


def check_roles(
    *,
    initial_global_parameters,
    distributor,
    client_work: ClientWork,
    aggregator,
    finalizer,
) -> None:
  """TypeError, naming the role and the types, for roles that do not fit
  together (as TFF's `composers._validate_args` does): each plays its
  role, the client work takes what the distributor sends, and the
  aggregation takes the uploads' `update` and `weight`."""
  for name, value, role in (('distributor', distributor, Distributor),
                            ('client_work', client_work, ClientWork),
                            ('finalizer', finalizer, Finalizer)):
    if not isinstance(value, role):
      raise TypeError(
          f'{name} must play the {role.__name__} role (`templates.roles`); '
          f'got {type(value).__name__}, which lacks some of its members.')
  if not (isinstance(initial_global_parameters, tff.Computation)
          and initial_global_parameters.type_signature.parameter is None):
    raise TypeError('initial_global_parameters must be a computation with '
                    'no parameter ( -> G).')
  if not isinstance(aggregator, tff.templates.AggregationProcess):
    raise TypeError('aggregator must be a tff.templates.AggregationProcess; '
                    f'got {type(aggregator).__name__}.')
  update_type = client_work.client_update.type_signature
  parameter = update_type.parameter
  if not isinstance(parameter, tff.StructType) or len(parameter) != 3:
    raise TypeError('client_work.client_update must take <B, L, D>; it '
                    f'takes {parameter}.')
  received = distributor.received_type(
      initial_global_parameters.type_signature.result)
  if not parameter[0].is_assignable_from(received):
    raise TypeError(
        'client_work.client_update cannot take what the distributor sends: '
        f'it takes {parameter[0]}, the distributor sends {received}.')
  result = update_type.result
  upload = result[1] if isinstance(result, tff.StructType) and len(
      result) == 2 else None
  if _member_names(upload)[:3] != ['update', 'weight', 'metrics'] or not {
      'loss_sum', 'num_examples'} <= set(_member_names(upload.metrics)):
    raise TypeError(
        'client_work.client_update must return <L\', <update, weight, '
        'metrics=<loss_sum, num_examples, ...>>>; it returns '
        f'{result}.')
  next_parameter = aggregator.next.type_signature.parameter
  if len(next_parameter) != 3:
    raise TypeError('aggregator must be weighted: next(<state, value, '
                    f'weight>); its next takes {next_parameter}.')
  if not next_parameter[1].member.is_assignable_from(upload.update):
    raise TypeError(
        'aggregator cannot take the uploads\' update: it takes '
        f'{next_parameter[1].member}, the clients upload {upload.update}.')
