"""Tests of FedRAS's downlink: the catch-up of a client's copy of the item
table from the compressed downlink (`downlink.catch_up`), and the server's
step from the clustered actions' aggregate (`downlink.ApplyActions`).

Whole processes with the compressed downlink are in
`fedras/compressed_exchange_test` and `fedras/methods_test`.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_federated as tff

from tff_fedrec.algorithms.fedras import downlink
from tff_fedrec.programs import execution

_NUM_ITEMS = 6
_DIM = 2


class _RoundValueCodec:
  """Test double: round r's message is the value r + 1 in every entry, and
  costs 10 bytes per unit of bandwidth."""

  def decode(self, message, bandwidth):
    rows = tf.tile(message['value'][tf.newaxis], [tf.size(bandwidth), 1, 1])
    return rows, self.message_bytes(message, bandwidth)

  def message_bytes(self, message, bandwidth):
    del message
    return tf.cast(bandwidth, tf.int64) * 10


def _ring(rounds):
  """Slots of H = len(rounds), slot j holding round rounds[j]."""
  return collections.OrderedDict(
      rounds=tf.constant(rounds, tf.int32),
      messages=collections.OrderedDict(
          value=tf.stack([
              tf.fill([_NUM_ITEMS, _DIM], float(r + 1)) for r in rounds
          ])
      ),
  )


def _catch_up(synced, *, round_num, ring, replaces=False,
              resync_when_cheaper=True):
  synced = np.asarray(synced, np.int32)
  return downlink.catch_up(
      _RoundValueCodec(),
      replaces=replaces,
      history=len(ring['rounds']),
      copy=tf.zeros([synced.size, _NUM_ITEMS, _DIM]),
      synced=synced,
      round_num=tf.constant(round_num),
      downlink=ring,
      table=tf.fill([_NUM_ITEMS, _DIM], 100.0),
      bandwidth=np.arange(1, synced.size + 1, dtype=np.int32),
      resync_when_cheaper=resync_when_cheaper,
  )


def test_catch_up_adds_every_missed_round_or_resyncs():
  # Round 3, H = 2: slots hold rounds 2 (slot 0) and 1 (slot 1).
  copies, sent, resynced, messages = _catch_up(
      [0, 1, 2, 3], round_num=3, ring=_ring([2, 1])
  )

  # User 0 missed rounds 0-2, one more than kept: the table, densely.
  # User 1 adds rounds 1 and 2 (values 2 + 3), user 2 round 2, user 3 is
  # up to date. Bytes: 10 x bandwidth (1, 2, 3, 4) per message.
  np.testing.assert_array_equal(copies[:, 0, 0], [100.0, 5.0, 3.0, 0.0])
  np.testing.assert_array_equal(
      sent, [4 * _NUM_ITEMS * _DIM, 2 * 20, 1 * 30, 0]
  )
  np.testing.assert_array_equal(resynced, [True, False, False, False])
  np.testing.assert_array_equal(messages, [0, 2, 1, 0])


def test_catch_up_resyncs_when_the_messages_cost_more_than_the_table():
  # The dense table costs 4 N d = 48 bytes. Bandwidths 1, 2, 3, 4: user 0
  # (10 bytes a message) and user 1 (20) catch up two rounds, 20 and 40
  # bytes; user 2 would pay 2 x 30 = 60 > 48, user 3 2 x 40 = 80 > 48.
  copies, sent, resynced, messages = _catch_up(
      [1, 1, 1, 2], round_num=3, ring=_ring([2, 1])
  )

  dense = 4 * _NUM_ITEMS * _DIM
  assert dense == 48
  np.testing.assert_array_equal(copies[:, 0, 0], [5.0, 5.0, 100.0, 3.0])
  np.testing.assert_array_equal(sent, [20, 40, dense, 40])
  np.testing.assert_array_equal(resynced, [False, False, True, False])
  np.testing.assert_array_equal(messages, [2, 2, 0, 1])

  # Without resync_when_cheaper, user 2 pays its 60 bytes of messages.
  copies, sent, resynced, messages = _catch_up(
      [1, 1, 1, 2], round_num=3, ring=_ring([2, 1]),
      resync_when_cheaper=False,
  )
  np.testing.assert_array_equal(copies[:, 0, 0], [5.0, 5.0, 5.0, 3.0])
  np.testing.assert_array_equal(sent, [20, 40, 60, 40])
  assert not np.any(resynced)


def test_catch_up_replacing_takes_the_latest_message_only():
  copies, sent, resynced, messages = _catch_up(
      [0, 2, 3], round_num=3, ring=_ring([2]), replaces=True
  )
  np.testing.assert_array_equal(copies[:, 0, 0], [3.0, 3.0, 0.0])
  np.testing.assert_array_equal(sent, [10, 20, 0])
  np.testing.assert_array_equal(messages, [1, 1, 0])
  assert not np.any(resynced)


def test_catch_up_refuses_a_ring_without_the_round():
  with pytest.raises(tf.errors.InvalidArgumentError, match='missing'):
    _catch_up([1], round_num=3, ring=_ring([0, 1]))


def test_apply_actions_adds_the_update_or_replaces_the_trained_rows():
  table = np.arange(6, dtype=np.float32).reshape([3, 2])
  layer = np.array([1.0, 2.0], np.float32)
  update = np.array([[1, 1], [0, 0], [5, 5]], np.float32)
  participants = np.array([2.0, 0.0, 1.0], np.float32)
  aggregate = collections.OrderedDict(
      item_embedding=collections.OrderedDict(
          update=update, participants=participants),
      layer=np.array([0.5, -0.5], np.float32))
  server_type = lambda structure: tff.FederatedType(
      tff.to_type(tf.nest.map_structure(
          lambda x: tff.TensorType(x.dtype, x.shape), structure)),
      tff.SERVER)

  @tff.federated_computation(
      server_type(collections.OrderedDict(item_embedding=table,
                                          layer=layer)),
      server_type(aggregate),
  )
  def apply(global_parameters, aggregate):
    results = {}
    for replaces in (False, True):
      _, new, _ = downlink.ApplyActions(
          replaces_trained_rows=replaces).finalize(
              tff.federated_value(collections.OrderedDict(), tff.SERVER),
              global_parameters, aggregate,
              tff.federated_value(np.int32(0), tff.SERVER))
      results[replaces] = new
    return tff.federated_zip(collections.OrderedDict(
        add=results[False], replace=results[True]))

  with execution.worker_execution_context():
    result = apply(collections.OrderedDict(item_embedding=table, layer=layer),
                   aggregate)
  # Added: every row moves by its update; replaced: rows that somebody
  # trained (participants > 0) take the update, row 1 keeps its value.
  np.testing.assert_array_equal(result['add']['item_embedding'],
                                table + update)
  np.testing.assert_array_equal(result['replace']['item_embedding'],
                                [[1, 1], [2, 3], [5, 5]])
  # The other parameters add their delta either way.
  for name in ('add', 'replace'):
    np.testing.assert_array_equal(result[name]['layer'], [1.5, 1.5])
