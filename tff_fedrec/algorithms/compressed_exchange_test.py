"""Tests of the client-copy process: types, catch-up, delegation.

Whole rounds against a hand-written Algorithm 1 are in `fedras_test`. The
TFF computations run on one TFF worker owned by this module
(`execution.worker_execution_context`), stopped when the module is done.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import models
from tff_fedrec.aggregators import clustered_actions
from tff_fedrec.aggregators import row_codecs
from tff_fedrec.algorithms import compressed_exchange
from tff_fedrec.algorithms import downlink_codecs
from tff_fedrec.algorithms import partially_local
from tff_fedrec.algorithms import two_phase
from tff_fedrec.algorithms import user_groups
from tff_fedrec.programs import execution

_NUM_ITEMS = 6
_DIM = 2
_TRAINING = partially_local.ClientTrainingConfig(
    learning_rate=0.5, item_learning_rate=2.0, batch_size=4,
    dual_personalization=False,
)
_MF = models.RecommenderSpec('matrix_factorization', _NUM_ITEMS, _DIM)
_NCF = models.RecommenderSpec(
    'neural_cf', _NUM_ITEMS, _DIM, (3,), personal_score_layers=False
)


@pytest.fixture(scope='module', autouse=True)
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


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
  return compressed_exchange.catch_up(
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


def _process(spec, **kwargs):
  params = models.initial_parameters(spec, seed=0)
  process = compressed_exchange.build_compressed_exchange_process(
      spec, params, _TRAINING,
      upload_codec=row_codecs.ClusteredActions(),
      downlink_codec=downlink_codecs.ClusteredActionsDownlink(
          _NUM_ITEMS, _DIM, expected_groups=3, alpha=0.3
      ),
      **kwargs,
  )
  return params, process


def _one_round(spec, params, process):
  """Two TFF clients of 2 and 1 users, from the initial client state."""
  state = compressed_exchange.initial_client_state(spec, params)
  users = [
      collections.OrderedDict(
          items=np.array(items, np.int32),
          labels=np.array(labels, np.float32),
          seed=np.array([0, user], np.int64),
      )
      for user, (items, labels) in enumerate([
          ([0, 1, 3, 3], [1, 0, 1, 0]),
          ([2, 5], [1, 0]),
          ([1, 4, 5], [0, 1, 1]),
      ])
  ]
  group_data, group_local = [], []
  for group in ([0, 1], [2]):
    data = user_groups.group_client_data([users[u] for u in group])
    data['bandwidth'] = np.full([len(group)], 2, np.int32)
    group_data.append(data)
    group_local.append(
        tf.nest.map_structure(
            lambda leaf, n=len(group): np.repeat(np.asarray(leaf)[None], n, 0),
            state['local_parameters'],
        )
    )
  return two_phase.run_round(
      process, process.initialize(), group_local, group_data
  )


def _names(struct_type):
  return [name for name, _ in tff.structure.iter_elements(struct_type)]


def test_type_signature():
  _, process = _process(_NCF, catch_up_rounds=5)

  assert isinstance(process, two_phase.TwoPhaseProcess)
  server_in, clients_in, data_in = process.next.type_signature.parameter
  server_out, clients_out, metrics = process.next.type_signature.result
  assert server_out.member.is_equivalent_to(server_in.member)
  assert clients_out.member.is_equivalent_to(clients_in.member)
  assert server_in.placement == tff.SERVER
  assert clients_in.placement == data_in.placement == tff.CLIENTS
  assert _names(server_in.member) == [
      'global_parameters', 'downlink', 'encoder', 'aggregator', 'round_num'
  ]
  assert _names(server_in.member.global_parameters) == [
      'item_embedding', 'score_layers'
  ]
  assert str(server_in.member.downlink.rounds) == 'int32[5]'
  assert str(clients_in.member) == (
      '<user_embedding=float32[?,2],item_copy=float32[?,6,2],'
      'synced_round=int32[?]>'
  )
  assert _names(data_in.member) == [
      'row_ids', 'num_rows', 'items', 'labels', 'num_examples', 'seeds',
      'bandwidth',
  ]
  assert _names(metrics.member) == [
      'train_loss', 'num_examples', 'download_bytes', 'resyncs', 'messages',
      'downlink', 'aggregator',
  ]
  assert str(metrics.member.aggregator.item) == (
      '<uploaded_bytes=int64,uploaded_users=int32,compressed_users=int32>'
  )


class _PlusOneFactory(tff.aggregators.UnweightedAggregationFactory):
  """Test double: the inner factory's `update`, then + 1 on every entry."""

  def __init__(self, inner):
    self._inner = inner

  def create(self, value_type):
    inner = self._inner.create(value_type)
    result_type = inner.next.type_signature.result.result.member

    @tff.tensorflow.computation(result_type)
    def add_one(result):
      result = collections.OrderedDict(result)
      result['update'] = result['update'] + 1.0
      return result

    @tff.federated_computation(
        inner.initialize.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
    )
    def next_fn(state, value):
      output = inner.next(state, value)
      return tff.templates.MeasuredProcessOutput(
          state=output.state,
          result=tff.federated_map(add_one, output.result),
          measurements=output.measurements,
      )

    return tff.templates.AggregationProcess(inner.initialize, next_fn)


def test_the_item_aggregator_is_what_moves_the_table():
  params, process = _process(_MF)
  _, plus_one = _process(
      _MF,
      item_aggregator=_PlusOneFactory(
          clustered_actions.ClusteredActionsFactory(_NUM_ITEMS)
      ),
  )

  state, _, metrics = _one_round(_MF, params, process)
  shifted, _, _ = _one_round(_MF, params, plus_one)

  np.testing.assert_allclose(
      shifted['global_parameters']['item_embedding'],
      state['global_parameters']['item_embedding'] + 1.0,
      rtol=1e-6,
  )
  # Items 0-5 all trained; 3 users sent 3, 2 and 3 rows (bandwidth 2).
  assert metrics['aggregator']['item']['uploaded_users'] == 3
  assert metrics['aggregator']['item']['compressed_users'] == 2
  assert metrics['download_bytes'] == 0 and metrics['resyncs'] == 0
  assert metrics['messages'] == 0  # Round 0: nothing to catch up on.


def test_the_model_aggregator_moves_theta():
  params, process = _process(_NCF)
  _, zero_theta = _process(
      _NCF,
      # Every client's theta delta is larger than 1e-9: all are zeroed.
      model_aggregator=tff.aggregators.zeroing_factory(
          1e-9, tff.aggregators.MeanFactory()
      ),
  )

  state, _, _ = _one_round(_NCF, params, process)
  frozen, _, _ = _one_round(_NCF, params, zero_theta)

  initial = params['score_layers'][0]['kernel']
  assert not np.allclose(
      state['global_parameters']['score_layers'][0]['kernel'], initial
  )
  np.testing.assert_array_equal(
      frozen['global_parameters']['score_layers'][0]['kernel'], initial
  )
  # Items move the same way: theta is aggregated on its own.
  np.testing.assert_allclose(
      frozen['global_parameters']['item_embedding'],
      state['global_parameters']['item_embedding'],
      rtol=1e-6,
  )


def test_clients_keep_their_caught_up_copy_and_sync_round():
  params, process = _process(_MF)

  _, new_local, _ = _one_round(_MF, params, process)

  for group in new_local:
    # Round 0 has no message to apply, and the trained rows stay behind.
    np.testing.assert_array_equal(
        group['item_copy'],
        np.broadcast_to(params['item_embedding'], group['item_copy'].shape),
    )
    np.testing.assert_array_equal(group['synced_round'], 0)
    assert group['user_embedding'].shape[1] == _DIM


def test_rejects_settings_it_does_not_implement():
  with pytest.raises(ValueError, match='dual personalization'):
    compressed_exchange.build_compressed_exchange_process(
        _MF, models.initial_parameters(_MF, 0),
        partially_local.ClientTrainingConfig(dual_personalization=True),
        upload_codec=None, downlink_codec=None,
    )
  personal = models.RecommenderSpec('neural_cf', _NUM_ITEMS, _DIM, (3,))
  with pytest.raises(ValueError, match='global'):
    compressed_exchange.build_compressed_exchange_process(
        personal, models.initial_parameters(personal, 0), _TRAINING,
        upload_codec=None, downlink_codec=None,
    )
  with pytest.raises(ValueError, match='catch_up_rounds'):
    _process(_MF, catch_up_rounds=0)
