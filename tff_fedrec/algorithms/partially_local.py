"""Partially local federated training with client state (PFedRec, FedMF, FedNCF).

The process keeps the model's client-local parameters (score function, user
embedding) and the client's fine-tuned item rows as client state, and
aggregates only the global parameters. Its type signature:

  initialize: ( -> S@SERVER)
  next: (<S@SERVER, {L}@CLIENTS, {D}@CLIENTS> -> <S@SERVER, {C}@CLIENTS, M@SERVER>)

with
  S = <global_parameters, aggregator, round_num>
  L = the client-local parameters of the client's users, leading dim [U]
  C = <local_parameters: L, personal_item_ids int32[U, T],
       personal_item_rows float32[U, T, d]>
  D = the users' data, `client_data_type()` (see `user_groups`)
  M = <train_loss, num_examples, aggregator measurements>

One TFF client simulates a group of U users (`user_groups`; U = 1 is one
device per client): each user trains on its own copy of the parameters and
the group uploads the mean of its users' uploads with weight U, so the round's
result does not depend on the grouping. The client state C is what the
program stores per user. Only its L part goes into `next`: a round starts
from the global item embedding (Algorithm 1, ClientUpdate line 1), so last
round's fine-tuned rows are read only for inference, and sending them in
would cost a third of the round for nothing (measured on ML-100K).
`tff.learning.templates.LearningProcess` cannot return client-placed values,
hence a `tff.templates.IterativeProcess`, built as a `two_phase.
TwoPhaseProcess` (client_step, then server_step on the uploads
U = <item, dense, metrics>) so that several executors train each client once.

Client side: `local_training.train_users_locally` (ClientUpdate) on a compact
table holding only the T rows of the items in the user's data (Sec. 4.3,
"Efficient on-device update"), so no client operation touches the whole
[I, d] table. A user uploads the deltas of those T rows (row-sparse) and
dense deltas of any other global parameters. With local differential privacy
(Sec. 6.6) it uploads the whole table plus Laplace noise instead: without
noise, a full-table upload reveals which rows changed anyway (the unchanged
ones), so sparse uploads leak nothing more; with noise, they would.

Server side (Algorithm 1, ServerExecute line 6): the global parameters move
by the mean of the users' deltas, theta^m <- 1/n sum_i theta_i^m, through
weighted `tff.aggregators` factories (weight = users per TFF client):
`aggregators.sparse_rows.RowSparseMeanFactory` for item rows
(`tff.aggregators.MeanFactory` for the dense LDP upload) and `MeanFactory`
for dense parameters, unless replaced. With dual personalization the client
keeps the item rows it fine-tuned and scores with them.
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
from tff_fedrec.aggregators import sparse_rows
from tff_fedrec.algorithms import two_phase


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
  """D: the data of one TFF client's group of U users (`user_groups`)."""
  return collections.OrderedDict(
      row_ids=tff.TensorType(np.int32, [None, None]),
      num_rows=tff.TensorType(np.int32, [None]),
      items=tff.TensorType(np.int32, [None, None]),
      labels=tff.TensorType(np.float32, [None, None]),
      num_examples=tff.TensorType(np.int32, [None]),
      seeds=tff.TensorType(np.int64, [None, 2]),
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


def local_parameters_type(
    spec: models.RecommenderSpec, params: models.Parameters
) -> tff.Type:
  """The type L of a group's client-local parameters (the input of `next`):
  one user's, with a leading user dimension [U, ...]."""
  _, local_params = models.split_parameters(spec, params)
  return tff.to_type(
      tf.nest.map_structure(
          lambda leaf: tff.TensorType(
              np.asarray(leaf).dtype.type, [None, *np.asarray(leaf).shape]
          ),
          local_params,
      )
  )


def build_partially_local_process(
    spec: models.RecommenderSpec,
    initial_params: models.Parameters,
    config: ClientTrainingConfig,
    *,
    item_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
) -> two_phase.TwoPhaseProcess:
  """Builds the process described in the module docstring.

  Args:
    spec: The model and its global / local declaration.
    initial_params: Initial parameters (`models.initial_parameters`).
    config: Local training hyperparameters.
    item_aggregator: Aggregates the item-embedding uploads, weighted by the
      number of users of the TFF client: row-sparse
      `sparse_rows.row_sparse_type(d)` values, or dense [I, d] ones when
      `config.ldp_noise_scale > 0`. `None` means
      `sparse_rows.RowSparseMeanFactory(num_items)`, respectively
      `tff.aggregators.MeanFactory()`: the average over users of PFedRec
      Algorithm 1 line 6 either way.
    model_aggregator: Aggregates the deltas of the other global parameters
      (FedNCF's shared MLP), weighted likewise; `None` means
      `tff.aggregators.MeanFactory()`.

  Returns:
    A `two_phase.TwoPhaseProcess`.
  """
  dense_upload = config.ldp_noise_scale > 0
  if item_aggregator is None:
    item_aggregator = (
        tff.aggregators.MeanFactory()
        if dense_upload
        else sparse_rows.RowSparseMeanFactory(spec.num_items)
    )
  if model_aggregator is None:
    model_aggregator = tff.aggregators.MeanFactory()
  global_init, _ = models.split_parameters(spec, initial_params)
  dense_keys = tuple(k for k in spec.global_keys if k != 'item_embedding')
  global_type = _type_of_structure(global_init)
  local_type = local_parameters_type(spec, initial_params)
  data_type = tff.to_type(client_data_type())
  weight_type = tff.TensorType(np.float32)
  item_upload_type = (
      _tensor_type_of(global_init['item_embedding'])
      if dense_upload
      else sparse_rows.row_sparse_type(spec.embedding_dim)
  )
  item_aggregation = item_aggregator.create(item_upload_type, weight_type)
  dense_aggregation = (
      model_aggregator.create(
          _type_of_structure(
              collections.OrderedDict((k, global_init[k]) for k in dense_keys)
          ),
          weight_type,
      )
      if dense_keys
      else None
  )

  def noised_table_upload(row_ids, row_deltas, seeds):
    """Sec. 6.6: each user's dense [I, d] delta plus its own Laplace noise,
    averaged over the group."""
    num_users = tf.shape(row_ids)[0]
    user_index = tf.broadcast_to(tf.range(num_users)[:, None], tf.shape(row_ids))
    table_deltas = tf.scatter_nd(
        tf.stack([user_index, row_ids], axis=-1),
        row_deltas,
        tf.concat(
            [[num_users], tf.shape(global_init['item_embedding'])], axis=0
        ),
    )
    # Fold in a tag so the noise never shares a seed with a reshuffle.
    noise = tf.map_fn(
        lambda seed: privacy.laplace_noise(
            tf.constant(global_init['item_embedding'].shape),
            config.ldp_noise_scale,
            seed=tf.random.experimental.stateless_fold_in(seed, 1 << 30),
        ),
        seeds,
        fn_output_signature=tf.float32,
    )
    return tf.reduce_mean(table_deltas + noise, axis=0)

  @tff.tensorflow.computation(global_type, local_type, data_type)
  def client_update(global_params, local_params, data):
    num_users = tf.shape(data['num_examples'])[0]
    per_user = lambda v: tf.repeat(tf.expand_dims(v, 0), num_users, axis=0)
    start = tf.nest.map_structure(
        per_user,
        collections.OrderedDict((k, global_params[k]) for k in dense_keys),
    )
    start['item_embedding'] = tf.gather(
        global_params['item_embedding'], data['row_ids']
    )
    result = local_training.train_users_locally(
        spec,
        models.merge_parameters(spec, start, local_params),
        data['items'],
        data['labels'],
        data['num_examples'],
        batch_size=config.batch_size,
        local_epochs=config.local_epochs,
        learning_rate=config.learning_rate,
        item_learning_rate=config.item_learning_rate,
        alternating=config.dual_personalization,
        shuffle_seeds=data['seeds'],
    )
    new_global, new_local = models.split_parameters(spec, result.parameters)
    # Padding rows were never trained: their deltas are exactly 0.
    row_deltas = new_global['item_embedding'] - start['item_embedding']
    if dense_upload:
      item_upload = noised_table_upload(
          data['row_ids'], row_deltas, data['seeds']
      )
    else:
      real_rows = tf.sequence_mask(
          data['num_rows'], tf.shape(data['row_ids'])[1]
      )
      item_upload = collections.OrderedDict(
          row_ids=tf.boolean_mask(data['row_ids'], real_rows),
          row_values=tf.boolean_mask(row_deltas, real_rows)
          / tf.cast(num_users, tf.float32),
      )
    dense_deltas = collections.OrderedDict(
        (
            k,
            tf.nest.map_structure(
                lambda new, old: tf.reduce_mean(new - old, axis=0),
                new_global[k],
                start[k],
            ),
        )
        for k in dense_keys
    )
    if config.dual_personalization:
      personal_ids = data['row_ids']
      personal_rows = new_global['item_embedding']
    else:
      personal_ids = tf.zeros([num_users, 0], tf.int32)
      personal_rows = tf.zeros([num_users, 0, spec.embedding_dim], tf.float32)
    new_state = collections.OrderedDict(
        local_parameters=new_local,
        personal_item_ids=personal_ids,
        personal_item_rows=personal_rows,
    )
    client_metrics = collections.OrderedDict(
        loss_sum=tf.reduce_sum(result.loss_sum),
        num_examples=tf.cast(tf.reduce_sum(result.num_examples), tf.float32),
        num_users=tf.cast(num_users, tf.float32),
    )
    return item_upload, dense_deltas, new_state, client_metrics

  @tff.tensorflow.computation(
      global_type,
      item_aggregation.next.type_signature.result.result.member,
      tff.to_type(
          collections.OrderedDict(
              (k, global_type[k]) for k in dense_keys
          )
      ),
  )
  def apply_update(global_params, item_delta, dense_deltas):
    updated = collections.OrderedDict(global_params)
    updated['item_embedding'] = global_params['item_embedding'] + item_delta
    for key in dense_keys:
      updated[key] = tf.nest.map_structure(
          tf.add, global_params[key], dense_deltas[key]
      )
    return updated

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
            aggregator=two_phase.initial_aggregator_state(
                item_aggregation, dense_aggregation
            ),
            round_num=tff.federated_value(np.int32(0), tff.SERVER),
        )
    )

  server_state_type = initialize.type_signature.result

  @tff.federated_computation(
      server_state_type,
      tff.FederatedType(local_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS),
  )
  def client_step(server_state, local_params, client_data):
    return two_phase.run_client_update(
        client_update,
        (
            tff.federated_broadcast(server_state.global_parameters),
            local_params,
            client_data,
        ),
    )

  @tff.federated_computation(
      server_state_type, two_phase.uploads_type(client_update)
  )
  def server_step(server_state, uploads):
    aggregated = two_phase.aggregate_uploads(
        item_aggregation, dense_aggregation, server_state.aggregator, uploads,
        weigh_items=True,
    )
    new_global = tff.federated_map(
        apply_update,
        (server_state.global_parameters, aggregated.item,
         aggregated.dense_mean),
    )
    train_loss, num_examples = two_phase.mean_train_loss(uploads.metrics)
    metrics = tff.federated_zip(
        collections.OrderedDict(
            train_loss=train_loss,
            num_examples=num_examples,
            aggregator=aggregated.measurements,
        )
    )
    new_server_state = tff.federated_zip(
        collections.OrderedDict(
            global_parameters=new_global,
            aggregator=aggregated.state,
            round_num=two_phase.next_round_num(server_state.round_num),
        )
    )
    return new_server_state, metrics

  return two_phase.TwoPhaseProcess(initialize, client_step, server_step)
