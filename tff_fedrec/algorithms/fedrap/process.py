"""FedRAP's TFF process, composed from the shared roles.

`composer.compose_client_state_process` with

  distributor  `distributors.Broadcast`: C and the round number;
  client work  `build_client_work`: each user's round of
               `local_training.train_users_locally` on the rows of its
               round's items, D^(i)'s from the program's store (in the
               client data) and C's from the broadcast; its upload is its
               trained copy of C as a delta (`group_mean_table_delta`);
  aggregator   `keyed.KeyedFactory(item_embedding=MeanFactory())`,
               weighted by the users of each TFF client: the uniform mean
               over users of their copies of C, as the reference code
               averages `item_commonality.weight`;
  finalizer    `finalizers.ApplyDelta`: C + the mean delta = the mean of
               the users' copies.

Types (`composer` gives S and M):

  G = <item_embedding: C float32[I, d]>
  L = <score_layers: [<kernel [U, d, 1], bias [U, 1]>] (the affine layer),
       untrained_row_scale [U], round_row_scale [U]> (`client_state`)
  C = <local_parameters: L, personal_item_ids int32[U, T],
       personal_item_rows float32[U, T, d]>, returned to the program,
       which merges the rows into each user's D^(i) (`client_state`)
  D = `client_training.client_data_type` of a broadcast, plus
      personal_rows float32[U, T, d]: each user's rows of D^(i) for its
      round's items
  upload = <update=<item_embedding: float32[I, d]>, weight=U,
            metrics=<loss_sum, num_examples>>
"""

import collections
from collections.abc import Sequence
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import tier_codecs
from tff_fedrec.aggregators import keyed
from tff_fedrec.algorithms.fedrap import local_training
from tff_fedrec.algorithms.local_items import client_training
from tff_fedrec.algorithms.local_items import exchanges
from tff_fedrec.templates import composer
from tff_fedrec.templates import distributors
from tff_fedrec.templates import finalizers
from tff_fedrec.templates import roles
from tff_fedrec.templates import two_phase


def initial_client_state(score_layers, embedding_dim: int):
  """One user's client state before its first round (numpy): the template
  model's affine layer, no trained rows of D^(i)."""
  return collections.OrderedDict(
      local_parameters=collections.OrderedDict(
          score_layers=score_layers,
          untrained_row_scale=np.float32(1.0),
          round_row_scale=np.float32(1.0),
      ),
      personal_item_ids=np.zeros([0], np.int32),
      personal_item_rows=np.zeros([0, embedding_dim], np.float32),
  )


def client_data_type(num_items: int, embedding_dim: int):
  """D of the module docstring."""
  data_type = client_training.client_data_type(
      exchanges.BroadcastExchange(num_items)
  )
  data_type['personal_rows'] = tff.TensorType(
      np.float32, [None, None, embedding_dim]
  )
  return data_type


def group_mean_table_delta(
    table: tf.Tensor,
    row_ids: tf.Tensor,
    num_rows: tf.Tensor,
    start_rows: tf.Tensor,
    trained_rows: tf.Tensor,
    round_row_scale: tf.Tensor,
) -> tf.Tensor:
  """The mean over a group of U users of (C_u - C), float32 [I, d].

  User u's copy C_u after its round is its trained rows on its row_ids and
  round_row_scale[u] x C elsewhere (weight decay, `local_training`), so the
  mean is (mean_u s_u - 1) C plus, on each user's rows, (trained - s_u
  start) / U.

  Args:
    table: C, float32 [I, d].
    row_ids: int32 [U, T], each user's rows (padded past num_rows[u]).
    num_rows: int32 [U].
    start_rows: float32 [U, T, d], C[row_ids].
    trained_rows: float32 [U, T, d], the trained rows.
    round_row_scale: float32 [U], s_u.
  """
  num_users = tf.cast(tf.shape(row_ids)[0], tf.float32)
  real = tf.sequence_mask(num_rows, tf.shape(row_ids)[1])
  changes = (
      trained_rows - round_row_scale[:, None, None] * start_rows
  ) / num_users
  return (tf.reduce_mean(round_row_scale) - 1.0) * table + tf.scatter_nd(
      tf.boolean_mask(row_ids, real)[:, None],
      tf.boolean_mask(changes, real),
      tf.shape(table),
  )


def encoded_group_mean_table_delta(
    codecs: Sequence[tier_codecs.UpdateCodec],
    table: tf.Tensor,
    row_ids: tf.Tensor,
    num_rows: tf.Tensor,
    start_rows: tf.Tensor,
    trained_rows: tf.Tensor,
    round_row_scale: tf.Tensor,
    tiers: tf.Tensor,
    seeds: tf.Tensor,
):
  """`group_mean_table_delta` with each user's message C_u - C (its
  whole table: weight decay moves every row) encoded by its device tier's
  codec (`tier_codecs.encode_message`, RF² Sec. 5.2), one user at a time
  so a group holds one [I, d] delta at once. Returns (the mean of the
  decoded deltas [I, d], `tier_upload_bytes` and `tier_users` float32
  [tiers]); `tiers` int32 [U], `seeds` int [U, 2]."""
  num_users = tf.shape(row_ids)[0]
  num_tiers = len(codecs)

  def add_user(u, total, sent, users):
    rows = row_ids[u, :num_rows[u]]
    scale = round_row_scale[u]
    delta = (scale - 1.0) * table + tf.scatter_nd(
        rows[:, None],
        trained_rows[u, :num_rows[u]] - scale * start_rows[u, :num_rows[u]],
        tf.shape(table))
    decoded, size = tier_codecs.encode_message(codecs, delta, tiers[u],
                                               seeds[u])
    tier = tf.one_hot(tiers[u], num_tiers)
    return u + 1, total + decoded, sent + size * tier, users + tier

  _, total, sent, users = tf.while_loop(
      lambda u, *_: u < num_users, add_user,
      (0, tf.zeros_like(table), tf.zeros([num_tiers]),
       tf.zeros([num_tiers])))
  return (total / tf.cast(num_users, tf.float32),
          collections.OrderedDict(tier_upload_bytes=sent, tier_users=users))


def build_client_work(
    config: local_training.FedRAPTrainingConfig,
    initial_state,
    broadcast_type: tff.Type,
    num_items: int,
    embedding_dim: int,
    upload_codecs: Optional[Sequence[tier_codecs.UpdateCodec]] = None,
) -> roles.ClientWork:
  """The client work of the module docstring; with `upload_codecs` (one
  per device tier) each user's message is encoded by its tier
  (`encoded_group_mean_table_delta`)."""
  local_type = tff.to_type(tf.nest.map_structure(
      lambda leaf: tff.TensorType(
          np.asarray(leaf).dtype.type, [None, *np.shape(leaf)]
      ),
      initial_state['local_parameters'],
  ))
  data_type = client_data_type(num_items, embedding_dim)
  if upload_codecs is not None:
    data_type['tier'] = tff.TensorType(np.int32, [None])
  data_type = tff.to_type(data_type)

  @tff.tensorflow.computation(broadcast_type, local_type, data_type)
  def client_update(broadcast, local, data):
    table = broadcast['global_parameters']['item_embedding']
    start = tf.gather(table, data['row_ids'])
    result = local_training.train_users_locally(
        data['personal_rows'], start, local['score_layers'],
        data['items'], data['labels'], data['num_examples'],
        round_num=broadcast['round_num'], shuffle_seeds=data['seeds'],
        config=config,
    )
    new_state = collections.OrderedDict(
        local_parameters=collections.OrderedDict(
            score_layers=result.score_layers,
            untrained_row_scale=(
                local['untrained_row_scale'] * result.round_row_scale
            ),
            round_row_scale=result.round_row_scale,
        ),
        personal_item_ids=data['row_ids'],
        personal_item_rows=result.personal_rows,
    )
    codec_metrics = {}
    if upload_codecs is None:
      mean_delta = group_mean_table_delta(
          table, data['row_ids'], data['num_rows'], start,
          result.global_rows, result.round_row_scale)
    else:
      seeds = tier_codecs.message_seeds(data['seeds'])
      mean_delta, codec_metrics = encoded_group_mean_table_delta(
          upload_codecs, table, data['row_ids'], data['num_rows'], start,
          result.global_rows, result.round_row_scale, data['tier'], seeds)
    update = collections.OrderedDict(item_embedding=mean_delta)
    return new_state, roles.upload(
        update, users=tf.shape(data['num_examples'])[0],
        loss_sum=result.loss_sum, num_examples=result.num_examples,
        **codec_metrics,
    )

  return roles.client_work(client_update)


def build_process(
    config: local_training.FedRAPTrainingConfig,
    initial_table: np.ndarray,
    initial_state,
    upload_codecs: Optional[Sequence[tier_codecs.UpdateCodec]] = None,
) -> two_phase.TwoPhaseProcess:
  """Builds the process of the module docstring.

  Args:
    config: The local training.
    initial_table: C's initial value, float32 [I, d].
    initial_state: One user's initial client state
      (`initial_client_state`).
    upload_codecs: Per device tier, how a user's message is encoded (RF²'s
      Prune / Quant / QuantS); None: sent as it is.
  """
  num_items, embedding_dim = np.shape(initial_table)

  @tff.tensorflow.computation
  def initial_global_parameters():
    return collections.OrderedDict(
        item_embedding=tf.constant(initial_table, tf.float32)
    )

  distributor = distributors.Broadcast()
  update_type = collections.OrderedDict(
      item_embedding=tff.TensorType(np.float32, [num_items, embedding_dim])
  )
  return composer.compose_client_state_process(
      initial_global_parameters=initial_global_parameters,
      distributor=distributor,
      client_work=build_client_work(
          config, initial_state,
          distributor.received_type(
              initial_global_parameters.type_signature.result
          ),
          num_items, embedding_dim, upload_codecs,
      ),
      aggregator=keyed.KeyedFactory(collections.OrderedDict(
          item_embedding=tff.aggregators.MeanFactory()
      )).create(tff.to_type(update_type), tff.TensorType(np.float32)),
      finalizer=finalizers.ApplyDelta(),
  )
