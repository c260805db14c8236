"""Tests of the compressed exchange in the local-item process: types,
delegation to the aggregators, the clients' copies, and PFedRec's dual
personalization composed with it.

Whole rounds against a hand-written Algorithm 1 are in `methods_test`,
the catch-up in `downlink_test`. The TFF
computations run on one TFF worker owned by this module
(`execution.worker_execution_context`), stopped when the module is done.
"""

import collections

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_fedrec import models
from tff_fedrec.algorithms.fedras import clustered_actions
from tff_fedrec.algorithms.fedras import compressed_exchange
from tff_fedrec.algorithms.fedras import downlink_codecs
from tff_fedrec.algorithms.fedras import row_codecs
from tff_fedrec.algorithms.local_items import client_training
from tff_fedrec.algorithms.local_items import compact_tables
from tff_fedrec.algorithms.local_items import personal_rows
from tff_fedrec.programs import execution
from tff_fedrec.templates import two_phase
from tff_fedrec.templates import user_groups

_NUM_ITEMS = 6
_DIM = 2
_TRAINING = client_training.ClientTrainingConfig(
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


def _exchange(**options):
  return compressed_exchange.CompressedExchange(
      num_items=_NUM_ITEMS,
      upload_codec=row_codecs.ClusteredActions(),
      downlink_codec=downlink_codecs.ClusteredActionsDownlink(
          _NUM_ITEMS, _DIM, expected_groups=3, alpha=0.3
      ),
      # Every user's bandwidth is 2 rows (the data below asks no more).
      bandwidths=lambda users: np.full([len(users)], 2, np.int32),
      **options,
  )


def _process(spec, training=_TRAINING, *, item_aggregator=None,
             model_aggregator=None, **options):
  params = models.initial_parameters(spec, seed=0)
  exchange = _exchange(**options)
  process = client_training.build_process(
      spec, params, training, exchange, item_aggregator=item_aggregator,
      model_aggregator=model_aggregator,
  )
  return params, (process, exchange)


def _one_round(spec, params, process_and_exchange, keeps_rows=False):
  """Two TFF clients of 2 and 1 users, from the initial client state (that
  keep every row they fine-tune if `keeps_rows`); returns (server state,
  the users' new client states, metrics)."""
  process, exchange = process_and_exchange
  store = personal_rows.PersonalRowsStore(
      3, client_training.initial_client_state(spec, params, exchange)
  )
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

  def group_data(positions):
    data = compact_tables.group_client_data([users[p] for p in positions])
    if keeps_rows:
      data.update(personal_rows.kept_rows(
          data['row_ids'], data['num_rows'], [None] * len(positions)))
    data['bandwidth'] = np.full([len(positions)], 2, np.int32)
    return data

  # Users of 4, 2 and 3 examples, 2 per group: groups [1, 2] and [0].
  state, metrics = user_groups.run_round(
      process, process.initialize(), store, np.arange(3),
      sizes=[len(u['items']) for u in users], make_group_data=group_data,
      users_per_group=2,
  )
  return state, store.get([0, 1, 2]), metrics


def _names(struct_type):
  return [name for name, _ in tff.structure.iter_elements(struct_type)]


def test_type_signature():
  _, process = _process(_NCF, catch_up_rounds=5)

  process, _ = process
  assert isinstance(process, two_phase.TwoPhaseProcess)
  server_in, clients_in, data_in = process.next.type_signature.parameter
  server_out, clients_out, metrics = process.next.type_signature.result
  assert server_out.member.is_equivalent_to(server_in.member)
  assert clients_out.member.local_parameters.is_equivalent_to(
      clients_in.member)
  assert server_in.placement == tff.SERVER
  assert clients_in.placement == data_in.placement == tff.CLIENTS
  assert _names(server_in.member) == [
      'global_parameters', 'distributor', 'aggregator', 'finalizer',
      'round_num',
  ]
  assert _names(server_in.member.distributor) == ['downlink', 'encoder']
  assert _names(server_in.member.global_parameters) == [
      'item_embedding', 'score_layers'
  ]
  assert str(server_in.member.distributor.downlink.rounds) == 'int32[5]'
  assert str(clients_in.member) == (
      '<user_embedding=float32[?,2],item_copy=float32[?,6,2],'
      'synced_round=int32[?]>'
  )
  assert _names(data_in.member) == [
      'row_ids', 'num_rows', 'items', 'labels', 'num_examples', 'seeds',
      'bandwidth',
  ]
  assert _names(metrics.member) == [
      'train_loss', 'num_examples', 'client_work', 'aggregator', 'finalizer',
      'distributor',
  ]
  assert _names(metrics.member.client_work) == [
      'loss_sum', 'num_examples', 'download_bytes', 'resyncs', 'messages',
  ]
  assert str(metrics.member.aggregator.item_embedding) == (
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
  assert metrics['aggregator']['item_embedding']['uploaded_users'] == 3
  assert metrics['aggregator']['item_embedding']['compressed_users'] == 2
  client = metrics['client_work']
  assert client['download_bytes'] == 0 and client['resyncs'] == 0
  assert client['messages'] == 0  # Round 0: nothing to catch up on.


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

  _, new_states, _ = _one_round(_MF, params, process)

  for state in new_states:
    local = state['local_parameters']
    # Round 0 has no message to apply, and the trained rows stay behind.
    np.testing.assert_array_equal(local['item_copy'], params['item_embedding'])
    assert local['synced_round'] == 0
    assert local['user_embedding'].shape == (_DIM,)
    # Without dual personalization nobody keeps personal rows.
    assert state['personal_item_ids'].shape == (0,)


def test_dual_personalization_composes_with_the_compressed_exchange():
  """PFedRec's client work on FedRAS's exchange: the score function and the
  fine-tuned rows stay on the device, the copy is the caught-up one."""
  pfedrec = models.RecommenderSpec('score_function', _NUM_ITEMS, _DIM)
  training = client_training.ClientTrainingConfig(
      learning_rate=0.5, item_learning_rate=2.0, batch_size=4,
      dual_personalization=True,
  )
  params, process = _process(pfedrec, training)

  state, new_states, _ = _one_round(pfedrec, params, process,
                                    keeps_rows=True)

  assert list(state['global_parameters']) == ['item_embedding']
  trained_items = [[0, 1, 3], [2, 5], [1, 4, 5]]
  for user_state, items in zip(new_states, trained_items):
    local = user_state['local_parameters']
    assert list(local) == ['score_layers', 'item_copy', 'synced_round']
    # Its fine-tuned rows are its own items', moved from the copy it
    # started from; the copy itself is round 0's, untouched.
    np.testing.assert_array_equal(user_state['personal_item_ids'], items)
    assert not np.allclose(user_state['personal_item_rows'],
                           params['item_embedding'][items])
    np.testing.assert_array_equal(local['item_copy'], params['item_embedding'])
    # The personal score function moved.
    assert not np.allclose(local['score_layers'][0]['kernel'],
                           params['score_layers'][0]['kernel'])
  # The server's table moved by the clustered-action mean.
  assert not np.allclose(state['global_parameters']['item_embedding'],
                         params['item_embedding'])


def test_rejects_settings_it_does_not_implement():
  with pytest.raises(ValueError, match='catch_up_rounds'):
    _exchange(catch_up_rounds=0)
  with pytest.raises(ValueError, match='normalization'):
    _exchange(normalization='median')
