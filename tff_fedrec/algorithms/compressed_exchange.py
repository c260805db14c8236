"""Clients with their own item-table copies exchanging compressed updates.

The process behind FedRAS (Lu et al., KDD 2025, Algorithm 1) and the
baselines it is compared with (`fedras`). Every client keeps its own copy
Q_u of the item table and applies the (compressed) item updates the server
sends (Sec. 3: "both the cloud server and devices maintain complete copies
of all item embeddings"). Round t:

  client u (ClientLocalTrain, lines 21-35), one TFF client simulating a
  group of U users (`user_groups`):
    1. catch up (`catch_up`): apply the server's messages of the rounds
       since its last one to Q_u (line 24), each decoded at u's bandwidth
       e_u; a client away more than H rounds (`catch_up_rounds`, how long
       the server keeps messages), or (`resync_when_cheaper`) whose missed
       messages would cost more bytes than the table, downloads the
       server's table in full;
    2. train p_u, the rows of Q_u of its items and the scoring model theta
       by SGD for tau local epochs (lines 28-31;
       `local_training.train_users_locally` on a compact table of the
       user's items; CoLR's item rows train in the round's low-rank
       subspace, `row_codecs.Colr.training_gradient_map`);
    3. upload Delta Q_u = Q_u^(t,tau) - Q_u^(t) on its items through the
       item aggregator, which encodes it (lines 33-35; FedRAS's clustered
       actions by default, `aggregators.clustered_actions`), and the theta
       deltas;
    it keeps p_u and the caught-up Q_u^(t), not its trained rows: the
    aggregate it receives next brings its own update back.
  server (lines 8-11):
    4. Delta Q^(t) = the aggregated decoded uploads (per item over the
       clients that trained it, Sec. 4.4, or FedAvg); Q^(t) = Q^(t-1) +
       Delta Q^(t); theta^(t) = theta^(t-1) + the mean theta delta
       (FedAvg, Sec. 4.4);
    5. encode Delta Q^(t) with the downlink codec (`downlink_codecs`; for
       FedRAS the adaptive cluster-and-split of Sec. 4.3, one message for
       every bandwidth) and keep the last H rounds' messages.

With `exchange_embeddings` (FedRAS-E, Sec. 5.4.1) the rows uploaded are the
trained embeddings, the server sets each trained item to their aggregate
and encodes the table Q^(t) itself, and a client replaces its copy with the
latest message (H = 1).

The process is a `two_phase.TwoPhaseProcess` (it returns client state):

  initialize: ( -> S@SERVER)
  next: (<S@SERVER, {L}@CLIENTS, {D}@CLIENTS> -> <S@SERVER, {L}@CLIENTS, M@SERVER>)

  S = <global_parameters=<item_embedding float32[N, d], [score_layers]>,
       downlink=<rounds int32[H], messages: H stacked downlink messages>,
       encoder=the downlink codec's state, aggregator=<item, [dense]>,
       round_num int32>
  L = <user_embedding float32[U, d], item_copy float32[U, N, d],
       synced_round int32[U]>  (one group of U users; synced_round s means
       the copy holds the messages of rounds < s)
  D = `client_data_type()`: `partially_local.client_data_type()` plus
      bandwidth int32[U], e_u in item rows (Sec. 4.1)
  M = <train_loss, num_examples, download_bytes int64, resyncs int32,
       messages int32 (downlink messages the clients applied),
       downlink=<the codec's summary>, aggregator=<item=<uploaded_bytes,
       uploaded_users, compressed_users>, [dense]>>

The uploads travel from client_step to server_step as the clients' raw
rows (CLIENTS-placed); the item aggregator's `federated_map` at CLIENTS
encodes them, so what reaches the server is the encoded message.
"""

import collections
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import gradient_compression
from tff_fedrec import local_training
from tff_fedrec import models
from tff_fedrec.aggregators import clustered_actions
from tff_fedrec.algorithms import partially_local
from tff_fedrec.algorithms import two_phase

DEFAULT_CATCH_UP_ROUNDS = 32
# Folded into a user's data seed for its k-means, so the clustering never
# shares a seed with the shuffles (seed + epoch).
_KMEANS_SEED_TAG = 1 << 29


def round_seed(seed: int, round_num) -> tf.Tensor:
  """int64 [2]: the seed server and clients share in round t (CoLR's B,
  the server's cluster-and-split)."""
  return tf.stack(
      [tf.constant(seed, tf.int64), tf.cast(round_num, tf.int64)]
  )


def kmeans_seeds(seeds) -> tf.Tensor:
  """int64 [U, 2]: each user's k-means seed from its data seed [U, 2]."""
  return tf.map_fn(
      lambda seed: tf.cast(
          tf.random.experimental.stateless_fold_in(seed, _KMEANS_SEED_TAG),
          tf.int64,
      ),
      tf.convert_to_tensor(seeds, tf.int64),
  )


def client_data_type() -> collections.OrderedDict:
  """D: `partially_local.client_data_type()` and each user's e_u."""
  data_type = partially_local.client_data_type()
  data_type['bandwidth'] = tff.TensorType(np.int32, [None])
  return data_type


def initial_client_state(
    spec: models.RecommenderSpec, params: models.Parameters
) -> collections.OrderedDict:
  """The state of a user that has not trained: the initial p_u and Q
  (Alg. 1 line 1), synced at round 0; no personal rows."""
  state = partially_local.initial_client_state(spec, params)
  state['local_parameters']['item_copy'] = np.asarray(
      params['item_embedding'], np.float32
  )
  state['local_parameters']['synced_round'] = np.int32(0)
  return state


def _tensor_type(value, leading=()) -> tff.TensorType:
  value = np.asarray(value)
  return tff.TensorType(value.dtype.type, [*leading, *value.shape])


def _structure_type(structure, leading=()) -> tff.Type:
  return tff.to_type(
      tf.nest.map_structure(lambda v: _tensor_type(v, leading), structure)
  )


def _missed_message_bytes(codec, message_of, synced, round_num, history,
                          bandwidth):
  """int64 [U]: what the messages of rounds s_u .. t-1 kept in the ring
  would cost each user (`codec.message_bytes`, no decode); only compared
  with the table for users within `history` rounds."""

  def add_round(r, cost):
    message_bytes = codec.message_bytes(message_of(r), bandwidth)
    return r + 1, cost + tf.where(
        synced <= r, message_bytes, tf.zeros_like(message_bytes)
    )

  _, cost = tf.while_loop(
      lambda r, _: r < round_num, add_round,
      (tf.maximum(round_num - history, tf.reduce_min(synced)),
       tf.zeros_like(synced, tf.int64)),
  )
  return cost


def catch_up(codec, *, replaces: bool, history: int, copy, synced, round_num,
             downlink, table, bandwidth, resync_when_cheaper: bool = True):
  """Step 1 of the module docstring for a group of U users (Alg. 1 l. 24).

  Additive messages (`replaces=False`): a user synced at s < t adds the
  decoded messages of rounds s .. t-1 to its copy, each at its bandwidth;
  one away more than `history` rounds, or (`resync_when_cheaper`) whose
  messages would together cost more than the dense table
  (`codec.message_bytes`), gets `table` instead (dense bytes): a resync is
  exact and then costs less.
  Replacing messages (FedRAS-E): a user with s < t takes the decoded
  message of round t-1 as its copy.

  Args:
    codec: the `downlink_codecs` codec of the messages.
    replaces: whether a message replaces the copy instead of adding to it.
    history: H, the rounds the ring `downlink` holds.
    copy: float32 [U, N, d], the users' copies.
    synced: int32 [U], s_u: each copy holds the messages of rounds < s_u.
    round_num: int32 [], t.
    downlink: <rounds int32 [H], messages: leading [H]>; round r is in slot
      r mod H.
    table: float32 [N, d], the server's Q^(t-1), for a resync.
    bandwidth: int32 [U], e_u in rows.

  Returns:
    (copies float32 [U, N, d], download bytes int64 [U], resynced bool [U],
    messages int32 [U]: how many messages each user applied).
  """
  num_items, dim = table.shape
  dense = tf.constant(
      gradient_compression.dense_bytes(num_items, dim), tf.int64
  )

  def message_of(r):
    slot = r % history
    check = tf.debugging.assert_equal(
        downlink['rounds'][slot], r, message='Downlink message missing'
    )
    with tf.control_dependencies([check]):
      return tf.nest.map_structure(
          lambda ring: ring[slot], downlink['messages']
      )

  if replaces:
    resync = tf.zeros_like(synced, tf.bool)
    first = tf.maximum(round_num - 1, tf.reduce_min(synced))
  else:
    resync = round_num - synced > history
    if resync_when_cheaper:
      resync = tf.logical_or(
          resync,
          _missed_message_bytes(
              codec, message_of, synced, round_num, history, bandwidth
          ) > dense,
      )
    copy = tf.where(resync[:, tf.newaxis, tf.newaxis], table, copy)
    first = tf.maximum(
        round_num - history,
        tf.reduce_min(tf.where(resync, round_num, synced)),
    )
  sent = tf.where(resync, dense, tf.constant(0, tf.int64))

  def apply_round(r, copy, sent, messages):
    rows, message_bytes = codec.decode(message_of(r), bandwidth)
    applies = tf.logical_and(synced <= r, tf.logical_not(resync))
    updated = rows if replaces else copy + rows
    copy = tf.where(applies[:, tf.newaxis, tf.newaxis], updated, copy)
    sent += tf.where(applies, message_bytes, tf.zeros_like(message_bytes))
    return r + 1, copy, sent, messages + tf.cast(applies, tf.int32)

  _, copy, sent, messages = tf.while_loop(
      lambda r, *_: r < round_num, apply_round,
      (first, copy, sent, tf.zeros_like(synced, tf.int32)),
  )
  return copy, sent, resync, messages


def build_compressed_exchange_process(
    spec: models.RecommenderSpec,
    initial_params: models.Parameters,
    training: partially_local.ClientTrainingConfig,
    *,
    upload_codec,
    downlink_codec,
    exchange_embeddings: bool = False,
    normalization: str = 'participation',
    catch_up_rounds: int = DEFAULT_CATCH_UP_ROUNDS,
    resync_when_cheaper: bool = True,
    seed: int = 0,
    item_aggregator: Optional[tff.aggregators.UnweightedAggregationFactory] = None,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
) -> two_phase.TwoPhaseProcess:
  """Builds the process of the module docstring.

  Args:
    spec: FedMF or FedNCF with a global MLP (`personal_score_layers=False`).
    initial_params: `models.initial_parameters(spec, seed)`.
    training: local SGD; `dual_personalization` and LDP must be off.
    upload_codec: a `row_codecs` codec: its `training_gradient_map` shapes
      local training, and the default item aggregator encodes with it.
    downlink_codec: a `downlink_codecs` codec for the server's message.
    exchange_embeddings: FedRAS-E: rows and messages carry embeddings, the
      client replaces its copy (module docstring).
    normalization: 'participation' (Sec. 4.4) or 'clients' (FedAvg).
    catch_up_rounds: H, the rounds of messages the server keeps (1 with
      exchange_embeddings).
    resync_when_cheaper: a client whose missed messages cost more bytes
      than the table downloads the table (`catch_up`); False keeps to
      messages within H rounds, as Algorithm 1 sends one a round.
    seed: seeds the per-round shared seed (`round_seed`).
    item_aggregator: aggregates `clustered_actions.upload_type(d)` into
      <update [N, d], participants [N]>; None means
      `clustered_actions.ClusteredActionsFactory(N, codec=upload_codec,
      normalization=normalization)`.
    model_aggregator: the weighted mean of the theta deltas (weight: users
      of the TFF client); None means `tff.aggregators.MeanFactory()`.
  """
  if training.dual_personalization or training.ldp_noise_scale > 0:
    raise ValueError(
        'FedRAS and its baselines train without dual personalization or LDP.'
    )
  if spec.personal_score_layers and spec.has_score_layers:
    raise ValueError('The scoring model theta is global (Sec. 4.4).')
  if catch_up_rounds < 1:
    raise ValueError(f'catch_up_rounds must be >= 1; got {catch_up_rounds}.')
  if exchange_embeddings:
    catch_up_rounds = 1
  history = catch_up_rounds
  if item_aggregator is None:
    item_aggregator = clustered_actions.ClusteredActionsFactory(
        spec.num_items, codec=upload_codec, normalization=normalization
    )
  if model_aggregator is None:
    model_aggregator = tff.aggregators.MeanFactory()
  dim = spec.embedding_dim
  global_init, local_init = models.split_parameters(spec, initial_params)
  dense_keys = tuple(k for k in spec.global_keys if k != 'item_embedding')
  global_type = _structure_type(global_init)
  local_state = collections.OrderedDict(local_init)
  local_state['item_copy'] = global_init['item_embedding']
  local_state['synced_round'] = np.int32(0)
  local_type = _structure_type(local_state, leading=[None])
  data_type = tff.to_type(client_data_type())
  item_aggregation = item_aggregator.create(clustered_actions.upload_type(dim))
  dense_init = collections.OrderedDict((k, global_init[k]) for k in dense_keys)
  dense_aggregation = (
      model_aggregator.create(
          _structure_type(dense_init), tff.TensorType(np.float32)
      )
      if dense_keys
      else None
  )

  @tff.tensorflow.computation
  def initial_downlink():
    zero = downlink_codec.zero_message()
    return collections.OrderedDict(
        rounds=tf.fill([history], -1),
        messages=tf.nest.map_structure(
            lambda leaf: tf.repeat(leaf[tf.newaxis], history, axis=0), zero
        ),
    )

  @tff.tensorflow.computation
  def initial_encoder_state():
    return downlink_codec.initial_state()

  @tff.tensorflow.computation
  def initial_global_parameters():
    return tf.nest.map_structure(tf.constant, global_init)

  downlink_type = initial_downlink.type_signature.result

  @tff.tensorflow.computation(
      global_type, downlink_type, np.int32, local_type, data_type
  )
  def client_update(global_params, downlink, round_num, local, data):
    num_users = tf.shape(data['num_examples'])[0]
    copy, download_bytes, resynced, messages = catch_up(
        downlink_codec,
        replaces=exchange_embeddings,
        history=history,
        copy=local['item_copy'],
        synced=local['synced_round'],
        round_num=round_num,
        downlink=downlink,
        table=global_params['item_embedding'],
        bandwidth=data['bandwidth'],
        resync_when_cheaper=resync_when_cheaper,
    )
    start_rows = tf.gather(copy, data['row_ids'], batch_dims=1)
    start = collections.OrderedDict(
        (k, tf.nest.map_structure(
            lambda v: tf.repeat(v[tf.newaxis], num_users, axis=0),
            global_params[k],
        ))
        for k in dense_keys
    )
    start['item_embedding'] = start_rows
    own = collections.OrderedDict((k, local[k]) for k in spec.local_keys)
    result = local_training.train_users_locally(
        spec,
        models.merge_parameters(spec, start, own),
        data['items'],
        data['labels'],
        data['num_examples'],
        batch_size=training.batch_size,
        local_epochs=training.local_epochs,
        learning_rate=training.learning_rate,
        item_learning_rate=training.item_learning_rate,
        alternating=False,
        shuffle_seeds=data['seeds'],
        item_gradient_maps=upload_codec.training_gradient_map(
            data['num_rows'], data['bandwidth'], dim,
            round_seed(seed, round_num),
        ),
    )
    new_global, new_local = models.split_parameters(spec, result.parameters)
    trained_rows = new_global['item_embedding']
    item_upload = collections.OrderedDict(
        row_ids=data['row_ids'],
        num_rows=data['num_rows'],
        row_values=(
            trained_rows if exchange_embeddings else trained_rows - start_rows
        ),
        bandwidth=data['bandwidth'],
        seeds=kmeans_seeds(data['seeds']),
        shared_seed=round_seed(seed, round_num),
    )
    dense_deltas = collections.OrderedDict(
        (k, tf.nest.map_structure(
            lambda new, old: tf.reduce_mean(new - old, axis=0),
            new_global[k], start[k],
        ))
        for k in dense_keys
    )
    new_state = collections.OrderedDict(new_local)
    new_state['item_copy'] = copy
    new_state['synced_round'] = tf.fill([num_users], round_num)
    client_metrics = collections.OrderedDict(
        loss_sum=tf.reduce_sum(result.loss_sum),
        num_examples=tf.cast(tf.reduce_sum(result.num_examples), tf.float32),
        num_users=tf.cast(num_users, tf.float32),
        download_bytes=tf.reduce_sum(download_bytes),
        resyncs=tf.reduce_sum(tf.cast(resynced, tf.int32)),
        messages=tf.reduce_sum(messages),
    )
    return item_upload, dense_deltas, new_state, client_metrics

  aggregated_type = item_aggregation.next.type_signature.result.result.member
  encoder_state_type = initial_encoder_state.type_signature.result

  @tff.tensorflow.computation(
      global_type, encoder_state_type, downlink_type, np.int32,
      aggregated_type, _structure_type(dense_init),
  )
  def server_update(global_params, encoder_state, downlink, round_num,
                    aggregated, dense_mean):
    table = global_params['item_embedding']
    if exchange_embeddings:
      trained = aggregated['participants'][:, tf.newaxis] > 0
      new_table = tf.where(trained, aggregated['update'], table)
      payload = new_table
    else:
      new_table = table + aggregated['update']
      payload = aggregated['update']
    message, encoder_state, summary = downlink_codec.encode(
        payload, encoder_state, round_seed(seed, round_num)
    )
    slot = [[round_num % history]]
    new_downlink = collections.OrderedDict(
        rounds=tf.tensor_scatter_nd_update(
            downlink['rounds'], slot, [round_num]
        ),
        messages=tf.nest.map_structure(
            lambda ring, new: tf.tensor_scatter_nd_update(
                ring, slot, new[tf.newaxis]
            ),
            downlink['messages'], message,
        ),
    )
    updated = collections.OrderedDict(global_params)
    updated['item_embedding'] = new_table
    for key in dense_keys:
      updated[key] = tf.nest.map_structure(
          tf.add, global_params[key], dense_mean[key]
      )
    return collections.OrderedDict(
        global_parameters=updated,
        downlink=new_downlink,
        encoder=encoder_state,
        summary=summary,
    )

  @tff.federated_computation
  def initialize():
    return tff.federated_zip(
        collections.OrderedDict(
            global_parameters=tff.federated_eval(
                initial_global_parameters, tff.SERVER
            ),
            downlink=tff.federated_eval(initial_downlink, tff.SERVER),
            encoder=tff.federated_eval(initial_encoder_state, tff.SERVER),
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
  def client_step(server_state, local_states, client_data):
    return two_phase.run_client_update(
        client_update,
        (
            tff.federated_broadcast(server_state.global_parameters),
            tff.federated_broadcast(server_state.downlink),
            tff.federated_broadcast(server_state.round_num),
            local_states,
            client_data,
        ),
    )

  @tff.federated_computation(
      server_state_type, two_phase.uploads_type(client_update)
  )
  def server_step(server_state, uploads):
    aggregated = two_phase.aggregate_uploads(
        item_aggregation, dense_aggregation, server_state.aggregator, uploads,
        weigh_items=False,
    )
    updated = tff.federated_map(
        server_update,
        (
            server_state.global_parameters,
            server_state.encoder,
            server_state.downlink,
            server_state.round_num,
            aggregated.item,
            aggregated.dense_mean,
        ),
    )
    train_loss, num_examples = two_phase.mean_train_loss(uploads.metrics)
    metrics = tff.federated_zip(
        collections.OrderedDict(
            train_loss=train_loss,
            num_examples=num_examples,
            download_bytes=tff.federated_sum(uploads.metrics.download_bytes),
            resyncs=tff.federated_sum(uploads.metrics.resyncs),
            messages=tff.federated_sum(uploads.metrics.messages),
            downlink=updated.summary,
            aggregator=aggregated.measurements,
        )
    )
    new_server_state = tff.federated_zip(
        collections.OrderedDict(
            global_parameters=updated.global_parameters,
            downlink=updated.downlink,
            encoder=updated.encoder,
            aggregator=aggregated.state,
            round_num=two_phase.next_round_num(server_state.round_num),
        )
    )
    return new_server_state, metrics

  return two_phase.TwoPhaseProcess(initialize, client_step, server_step)
