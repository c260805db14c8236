"""RF²'s TFF process: FedAvg of one full-batch SGD step per client, each
update encoded by its device tier, a PyTorch Adagrad step at the server
(Maeng et al., RecSys '22, Sec. 5.1-5.2; the authors' `fl_libs` as
`../shared/specs/rf2.md` section 4 reads them).

Composed from the shared roles:

  distributor  `distributors.Broadcast` of the model;
  client work  each user of the group takes one SGD step (rate 1.0) on
               the mean BCE of all its training events plus
               1e-6 sum w^2 over the whole embedding tables, from the
               broadcast model with its tier's Channel masks applied
               (`models.channel_masks`), and uploads
               delta_u = w - w' (every tensor, dense), its tier, its seed
               and its weight n_u (its events);
  aggregation  `aggregators.tier_codec_mean.TierCodecMeanFactory`: each
               delta encoded by its tier's codec at the client, then
               sum_u n_u m_u delta_u / sum_u n_u m_u;
  finalizer    `finalizers.ServerAdagrad` (PyTorch's semantics) on the
               pseudo-gradient, the aggregated delta.

  next: (<S@SERVER, {L}@CLIENTS, {D}@CLIENTS> -> <S@SERVER, {L}@CLIENTS, M@SERVER>)

L is empty: RF²'s clients keep nothing between rounds. D, a group of U
users padded to N events: item int32 [U, N], genres [U, N, G], history
[U, N, H], label float32 [U, N], num_examples int32 [U], tier int32 [U],
seed int64 [U, 2].
"""

import collections
from collections.abc import Sequence
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import tier_codecs
from tff_fedrec.aggregators import tier_codec_mean
from tff_fedrec.algorithms.rf2 import models
from tff_fedrec.templates import composer
from tff_fedrec.templates import distributors
from tff_fedrec.templates import finalizers
from tff_fedrec.templates import roles

CLIENT_LEARNING_RATE = 1.0
EMBEDDING_L2 = 1e-6
NO_STATE = collections.OrderedDict()


def data_type(genres_width: int, history_length: int):
  """The type of a group's client data (module docstring)."""
  return collections.OrderedDict(
      item=tff.TensorType(np.int32, [None, None]),
      genres=tff.TensorType(np.int32, [None, None, genres_width]),
      history=tff.TensorType(np.int32, [None, None, history_length]),
      label=tff.TensorType(np.float32, [None, None]),
      num_examples=tff.TensorType(np.int32, [None]),
      tier=tff.TensorType(np.int32, [None]),
      seed=tff.TensorType(np.int64, [None, 2]),
  )


def user_loss(spec, params, features, labels, mask):
  """(mean BCE over the user's real events, their BCE sum): one user's
  data term; `mask` float32 [N] marks the real events."""
  losses = tf.nn.sigmoid_cross_entropy_with_logits(
      labels, models.logits(spec, params, features)) * mask
  total = tf.reduce_sum(losses)
  return total / tf.maximum(tf.reduce_sum(mask), 1.0), total


def user_delta(spec, params, features, labels, mask, *,
               learning_rate=CLIENT_LEARNING_RATE, embedding_l2=EMBEDDING_L2,
               channel_mask=None):
  """(w - w', BCE sum) of one full-batch SGD step of one user from
  `params`, its tier's Channel mask applied first (None: none)."""
  params = tf.nest.map_structure(tf.convert_to_tensor, params)
  with tf.GradientTape() as tape:
    tape.watch(params)
    used = params if channel_mask is None else models.apply_masks(
        params, channel_mask)
    mean, total = user_loss(spec, used, features, labels, mask)
    loss = mean + embedding_l2 * models.embedding_l2(used)
  gradients = tape.gradient(loss, params)
  return tf.nest.map_structure(
      lambda g: learning_rate * tf.convert_to_tensor(g), gradients), total


def _client_work(spec, shapes, channel_masks, genres_width, history_length,
                 learning_rate, embedding_l2):
  """`shapes`: arrays in the nest of the parameters (their shapes)."""
  global_type = tff.to_type(tf.nest.map_structure(
      lambda x: tff.TensorType(np.float32, x.shape), shapes))
  stacked_masks = None if channel_masks is None else tf.nest.map_structure(
      lambda *leaves: np.stack(leaves), *channel_masks)

  @tff.tensorflow.computation(
      distributors.Broadcast().received_type(global_type),
      NO_STATE, data_type(genres_width, history_length))
  def client_update(received, state, data):
    params = received['global_parameters']
    width = tf.shape(data['label'])[1]

    def one_user(inputs):
      item, genres, history, label, count, tier = inputs
      mask = tf.sequence_mask(count, width, tf.float32)
      channel_mask = None if stacked_masks is None else tf.nest.map_structure(
          lambda m: tf.gather(m, tier), stacked_masks)
      return user_delta(
          spec, params,
          collections.OrderedDict(item=item, genres=genres, history=history),
          label, mask, learning_rate=learning_rate,
          embedding_l2=embedding_l2, channel_mask=channel_mask)

    deltas, losses = tf.map_fn(
        one_user,
        (data['item'], data['genres'], data['history'], data['label'],
         data['num_examples'], data['tier']),
        fn_output_signature=(
            tf.nest.map_structure(
                lambda x: tf.TensorSpec(x.shape, tf.float32), shapes),
            tf.TensorSpec([], tf.float32)))
    weight = tf.cast(data['num_examples'], tf.float32)
    return state, collections.OrderedDict(
        update=collections.OrderedDict(delta=deltas, tier=data['tier'],
                                       seed=data['seed']),
        weight=weight,
        metrics=collections.OrderedDict(loss_sum=tf.reduce_sum(losses),
                                        num_examples=tf.reduce_sum(weight)))

  return roles.client_work(client_update)


def build_process(
    spec: models.ClickModelSpec,
    initial_params,
    *,
    codecs: Sequence[tier_codecs.UpdateCodec],
    channel_multipliers: Optional[Sequence[float]],
    server_learning_rate: float,
    genres_width: int,
    history_length: int,
    learning_rate: float = CLIENT_LEARNING_RATE,
    embedding_l2: float = EMBEDDING_L2,
) -> tff.templates.IterativeProcess:
  """The process of the module docstring.

  Args:
    spec: The model.
    initial_params: Its initial parameters (numpy, `models.
      initial_parameters`).
    codecs: Per tier, the encoding of its users' updates.
    channel_multipliers: Per tier, the share of hidden units it keeps
      (Channel), or None for the whole model everywhere.
    server_learning_rate: Adagrad's (0.1 on MovieLens, 0.01 on Taobao).
    genres_width, history_length: G and H of the client data.
    learning_rate, embedding_l2: The clients' SGD rate and L2 factor.
  """
  masks = None if channel_multipliers is None else [
      models.channel_masks(spec, m) for m in channel_multipliers]
  work = _client_work(spec, initial_params, masks, genres_width,
                      history_length, learning_rate, embedding_l2)
  initial = tff.tensorflow.computation(
      lambda: tf.nest.map_structure(tf.constant, initial_params))
  return composer.compose_client_state_process(
      initial_global_parameters=initial,
      distributor=distributors.Broadcast(),
      client_work=work,
      aggregator=tier_codec_mean.TierCodecMeanFactory(codecs, masks).create(
          work.upload_type.update, work.upload_type.weight),
      finalizer=finalizers.ServerAdagrad(
          initial_params, learning_rate=server_learning_rate),
  )
