"""Partially local federated training with client state (PFedRec, FedMF, FedNCF).

The process keeps the model's client-local parameters (score function, user
embedding) and the client's fine-tuned item rows as client state, and
aggregates only the global parameters. Its type signature:

  initialize: ( -> S@SERVER)
  next: (<S@SERVER, {C}@CLIENTS, {D}@CLIENTS> -> <S@SERVER, {C}@CLIENTS, M@SERVER>)

with
  S = <global_parameters, aggregator, round_num>
  C = <local_parameters, personal_item_ids int32[?], personal_item_rows f32[?,d]>
  D = <items int32[?], labels f32[?], seed int64[2]>
  M = <train_loss, num_examples, aggregator measurements>

`tff.learning.templates.LearningProcess` cannot return client-placed values,
hence a `tff.templates.IterativeProcess` (the program holds the client state
store between rounds).

Server side (PFedRec Algorithm 1, ServerExecute line 6): the global parameters
move by the aggregate of the clients' deltas; with the default
`tff.aggregators.UnweightedMeanFactory` that is theta^m <- 1/n sum_i theta_i^m,
the direct average of the uploaded item embeddings.

Client side: `local_training.train_locally` (ClientUpdate). With dual
personalization the client keeps the rows of its fine-tuned item embedding
that it trained (Sec. 4.3 "Efficient on-device update": a device only keeps
the interacted items and its sampled negatives) and scores with them; the next
round starts again from the global item embedding (line 1).
"""

import collections
import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import local_training
from tff_fedrec import models
from tff_fedrec import privacy


@dataclasses.dataclass(frozen=True)
class ClientTrainingConfig:
  """Hyperparameters of the local training (PFedRec Sec. 6.2 defaults).

  Attributes:
    learning_rate: SGD step of user embeddings and dense layers.
    item_learning_rate: SGD step of item embedding rows (see README: the
      reference code uses learning_rate * num_items * 80).
    batch_size: Minibatch size B.
    local_epochs: Local epochs E.
    dual_personalization: Alternating updates and personal item rows (Sec 4.2).
    ldp_noise_scale: Laplace scale lambda added to uploaded item embeddings
      (Sec. 6.6); 0 disables it.
  """

  learning_rate: float = 0.1
  item_learning_rate: float = 0.1 * 1682 * 80
  batch_size: int = 256
  local_epochs: int = 1
  dual_personalization: bool = True
  ldp_noise_scale: float = 0.0


def client_data_type() -> collections.OrderedDict:
  return collections.OrderedDict(
      items=tff.TensorType(np.int32, [None]),
      labels=tff.TensorType(np.float32, [None]),
      seed=tff.TensorType(np.int64, [2]),
  )


def _tensor_type_of(value) -> tff.TensorType:
  value = np.asarray(value)
  return tff.TensorType(value.dtype.type, value.shape)


def _type_of_structure(structure) -> tff.Type:
  return tff.to_type(tf.nest.map_structure(_tensor_type_of, structure))


def initial_client_state(
    spec: models.RecommenderSpec, params: models.Parameters
) -> collections.OrderedDict:
  """The state of a client that has not trained yet (numpy).

  All clients start from the server's initial local parameters, as in the
  reference code (Algorithm 1, ServerExecute line 1 initialises theta^s).
  """
  _, local_params = models.split_parameters(spec, params)
  return collections.OrderedDict(
      local_parameters=local_params,
      personal_item_ids=np.zeros([0], np.int32),
      personal_item_rows=np.zeros([0, spec.embedding_dim], np.float32),
  )


def client_state_type(
    spec: models.RecommenderSpec, params: models.Parameters
) -> tff.Type:
  state = initial_client_state(spec, params)
  return tff.to_type(
      collections.OrderedDict(
          local_parameters=_type_of_structure(state['local_parameters']),
          personal_item_ids=tff.TensorType(np.int32, [None]),
          personal_item_rows=tff.TensorType(
              np.float32, [None, spec.embedding_dim]
          ),
      )
  )


def build_partially_local_process(
    spec: models.RecommenderSpec,
    initial_params: models.Parameters,
    config: ClientTrainingConfig,
    *,
    model_aggregator: Optional[tff.aggregators.UnweightedAggregationFactory] = None,
) -> tff.templates.IterativeProcess:
  """Builds the process described in the module docstring.

  Args:
    spec: The model and its global / local declaration.
    initial_params: Initial parameters (`models.initial_parameters`).
    config: Local training hyperparameters.
    model_aggregator: Aggregates the clients' deltas of the global parameters;
      `None` means `tff.aggregators.UnweightedMeanFactory()` (the unweighted
      average of PFedRec Algorithm 1 line 6).

  Returns:
    A `tff.templates.IterativeProcess`.
  """
  if model_aggregator is None:
    model_aggregator = tff.aggregators.UnweightedMeanFactory()
  global_init, _ = models.split_parameters(spec, initial_params)
  global_type = _type_of_structure(global_init)
  state_type = client_state_type(spec, initial_params)
  data_type = tff.to_type(client_data_type())
  aggregation = model_aggregator.create(global_type)

  @tff.tensorflow.computation(global_type, state_type, data_type)
  def client_update(global_params, client_state, data):
    params = models.merge_parameters(
        spec, global_params, client_state['local_parameters']
    )
    result = local_training.train_locally(
        spec,
        params,
        data['items'],
        data['labels'],
        batch_size=config.batch_size,
        local_epochs=config.local_epochs,
        learning_rate=config.learning_rate,
        item_learning_rate=config.item_learning_rate,
        alternating=config.dual_personalization,
        shuffle_seed=data['seed'],
    )
    new_global, new_local = models.split_parameters(spec, result.parameters)
    delta = tf.nest.map_structure(tf.subtract, new_global, global_params)
    if config.ldp_noise_scale > 0:
      delta['item_embedding'] += privacy.laplace_noise(
          tf.shape(delta['item_embedding']),
          config.ldp_noise_scale,
          # Fold in a tag so the noise never shares a seed with a reshuffle.
          seed=tf.random.experimental.stateless_fold_in(data['seed'], 1 << 30),
      )
    if config.dual_personalization:
      personal_ids, _ = tf.unique(data['items'])
      personal_rows = tf.gather(result.parameters['item_embedding'], personal_ids)
    else:
      personal_ids = tf.zeros([0], tf.int32)
      personal_rows = tf.zeros([0, spec.embedding_dim], tf.float32)
    new_state = collections.OrderedDict(
        local_parameters=new_local,
        personal_item_ids=personal_ids,
        personal_item_rows=personal_rows,
    )
    client_metrics = collections.OrderedDict(
        loss_sum=result.loss_sum,
        num_examples=tf.cast(result.num_examples, tf.float32),
    )
    return delta, new_state, client_metrics

  @tff.tensorflow.computation(global_type, global_type)
  def apply_update(global_params, mean_delta):
    return tf.nest.map_structure(tf.add, global_params, mean_delta)

  @tff.tensorflow.computation
  def initial_global_parameters():
    return tf.nest.map_structure(tf.constant, global_init)

  @tff.federated_computation
  def initialize():
    return tff.federated_zip(
        collections.OrderedDict(
            global_parameters=tff.federated_eval(
                initial_global_parameters, tff.SERVER
            ),
            aggregator=aggregation.initialize(),
            round_num=tff.federated_value(np.int32(0), tff.SERVER),
        )
    )

  server_state_type = initialize.type_signature.result

  @tff.tensorflow.computation(np.int32)
  def increment(round_num):
    return round_num + 1

  @tff.tensorflow.computation(np.float32, np.float32)
  def safe_divide(numerator, denominator):
    return tf.math.divide_no_nan(numerator, denominator)

  @tff.federated_computation(
      server_state_type,
      tff.FederatedType(state_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS),
  )
  def next_fn(server_state, client_states, client_data):
    deltas, new_client_states, client_metrics = tff.federated_map(
        client_update,
        (
            tff.federated_broadcast(server_state.global_parameters),
            client_states,
            client_data,
        ),
    )
    aggregate = aggregation.next(server_state.aggregator, deltas)
    new_global = tff.federated_map(
        apply_update, (server_state.global_parameters, aggregate.result)
    )
    loss_sum = tff.federated_sum(client_metrics.loss_sum)
    num_examples = tff.federated_sum(client_metrics.num_examples)
    metrics = tff.federated_zip(
        collections.OrderedDict(
            train_loss=tff.federated_map(safe_divide, (loss_sum, num_examples)),
            num_examples=num_examples,
            aggregator=aggregate.measurements,
        )
    )
    new_server_state = tff.federated_zip(
        collections.OrderedDict(
            global_parameters=new_global,
            aggregator=aggregate.state,
            round_num=tff.federated_map(increment, server_state.round_num),
        )
    )
    return new_server_state, new_client_states, metrics

  return tff.templates.IterativeProcess(initialize, next_fn)
