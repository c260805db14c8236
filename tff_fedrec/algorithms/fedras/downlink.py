"""FedRAS's downlink (Lu et al., KDD 2025, Sec. 4.3 and Algorithm 1): the
server's encoded item-table updates into every client's own copy.

  CompressedDownlink  the distributor (`templates.roles.Distributor`): it
                      keeps the last H rounds' encoded aggregates and sends
                      them; `catch_up` brings a group of clients' copies up
                      to date from them (Algorithm 1, line 24);
  ApplyActions        the finalizer: the item table moves by the clustered
                      actions' participation mean (Sec. 4.4), or, for
                      FedRAS-E, the trained rows take it; the other global
                      parameters move by their delta;
  round_seed          the seed server and clients share in a round.

Example:
  >>> distributor = CompressedDownlink(codec, history=32, seed=0)
  >>> finalizer = ApplyActions(replaces_trained_rows=False)
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec.algorithms.fedras import compression
from tff_fedrec.templates import finalizers


class ApplyActions:
  """new = global + aggregate, where the aggregate's `item_embedding` is
  <update [N, d], participants [N]> (`clustered_actions`): the table adds
  `update`, or with `replaces_trained_rows` (FedRAS-E) every row some
  client trained takes it; the other parameters add their delta
  (`finalizers.add_delta`)."""

  initial_state = finalizers.ApplyDelta.initial_state

  def __init__(self, *, replaces_trained_rows: bool = False):
    self._replaces_trained_rows = replaces_trained_rows

  def finalize(self, state, global_parameters, aggregate, round_num):
    del round_num
    replaces = self._replaces_trained_rows

    def apply(global_parameters, aggregate):
      actions = aggregate['item_embedding']
      updated = finalizers.add_delta(global_parameters, collections.OrderedDict(
          (key, value) for key, value in aggregate.items()
          if key != 'item_embedding'))
      table = global_parameters['item_embedding']
      if replaces:
        trained = actions['participants'][:, tf.newaxis] > 0
        updated['item_embedding'] = tf.where(trained, actions['update'], table)
      else:
        updated['item_embedding'] = table + actions['update']
      return updated

    return state, finalizers.map_on_server(
        apply, global_parameters, aggregate), finalizers.no_measurements()


def round_seed(seed: int, round_num) -> tf.Tensor:
  """int64 [2]: the seed server and clients share in round t (CoLR's B,
  the server's cluster-and-split)."""
  return tf.stack(
      [tf.constant(seed, tf.int64), tf.cast(round_num, tf.int64)]
  )


class CompressedDownlink:
  """Encoded item-table updates into the clients' own copies (FedRAS).

  Server state <downlink=<rounds int32[H], messages: H stacked messages>,
  encoder=the codec's state>: round r's message sits in slot r mod H. Each
  round the server encodes the item aggregate's `update` [N, d] (or, with
  `replaces`, the new item table itself: FedRAS-E) with `codec`
  (`downlink_codecs`) and keeps it; clients receive
  B = <global_parameters, round_num, downlink> and apply the messages they
  missed to their copies (`catch_up`). Measurements: the codec's summary.
  The aggregate's `item_embedding` is the clustered actions'
  <update, participants> (`clustered_actions`).

  Attributes:
    codec: The downlink codec.
    history: H, the rounds of messages kept (1 with `replaces`).
    replaces: A message replaces a client's copy instead of adding to it.
    seed: Seeds `round_seed`, shared by encoder and clients.
  """

  def __init__(self, codec, *, history: int, replaces: bool = False,
               seed: int = 0):
    if history < 1:
      raise ValueError(f'history must be >= 1; got {history}.')
    self.codec = codec
    self.history = 1 if replaces else history
    self.replaces = replaces
    self.seed = seed
    history = self.history

    @tff.tensorflow.computation
    def initial_state():
      zero = codec.zero_message()
      return collections.OrderedDict(
          downlink=collections.OrderedDict(
              rounds=tf.fill([history], -1),
              messages=tf.nest.map_structure(
                  lambda leaf: tf.repeat(leaf[tf.newaxis], history, axis=0),
                  zero,
              ),
          ),
          encoder=codec.initial_state(),
      )

    self.initial_state = initial_state

  def received_type(self, global_type) -> tff.Type:
    return tff.to_type(collections.OrderedDict(
        global_parameters=global_type, round_num=np.int32,
        downlink=self.initial_state.type_signature.result.downlink,
    ))

  def distribute(self, server_state):
    return tff.federated_broadcast(tff.federated_zip(collections.OrderedDict(
        global_parameters=server_state.global_parameters,
        round_num=server_state.round_num,
        downlink=server_state.distributor.downlink,
    )))

  def record(self, state, aggregate, new_global, round_num):
    codec, history, seed, replaces = (
        self.codec, self.history, self.seed, self.replaces)

    def encode(state, aggregate, new_global, round_num):
      payload = (new_global['item_embedding'] if replaces
                 else aggregate['item_embedding']['update'])
      message, encoder_state, summary = codec.encode(
          payload, state['encoder'], round_seed(seed, round_num)
      )
      downlink = state['downlink']
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
      return collections.OrderedDict(
          downlink=new_downlink, encoder=encoder_state
      ), summary

    computation = tff.tensorflow.computation(
        encode, state.type_signature.member, aggregate.type_signature.member,
        new_global.type_signature.member, round_num.type_signature.member,
    )
    new_state, summary = tff.federated_map(
        computation, (state, aggregate, new_global, round_num)
    )
    return new_state, summary

  def catch_up(self, broadcast, copy, synced, bandwidth,
               resync_when_cheaper: bool = True):
    """`catch_up` of a group of users with this downlink's messages."""
    return catch_up(
        self.codec, replaces=self.replaces, history=self.history, copy=copy,
        synced=synced, round_num=broadcast['round_num'],
        downlink=broadcast['downlink'],
        table=broadcast['global_parameters']['item_embedding'],
        bandwidth=bandwidth, resync_when_cheaper=resync_when_cheaper,
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
  """Brings a group of U users' copies up to round t (FedRAS Alg. 1 l. 24).

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
      compression.dense_bytes(num_items, dim), tf.int64
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
