"""Tests of the local-item-training process (broadcast exchange) against a
plain-TF reference round of PFedRec's Algorithm 1.

All computations run on one TFF worker owned by this module
(`execution.worker_execution_context`), stopped when the module is done.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import models
from tff_fedrec import tier_codecs
from tff_fedrec.aggregators import sparse_rows
from tff_fedrec.algorithms.local_items import client_training
from tff_fedrec.algorithms.local_items import compact_tables
from tff_fedrec.algorithms.local_items import exchanges
from tff_fedrec.algorithms.local_items import local_sgd
from tff_fedrec.algorithms.local_items import personal_rows
from tff_fedrec.programs import execution
from tff_fedrec.templates import user_groups

_NUM_ITEMS = 20
_DIM = 4
# One batch per client (clients have at most 7 examples), so these tests do
# not depend on the order of the examples; see
# test_multi_batch_clients_match_reference for several batches.
_CONFIG = client_training.ClientTrainingConfig(
    learning_rate=0.5,
    item_learning_rate=5.0,
    batch_size=8,
    local_epochs=1,
    dual_personalization=True,
)
_PFEDREC_SPEC = models.RecommenderSpec('score_function', _NUM_ITEMS, _DIM)
_BROADCAST = exchanges.BroadcastExchange(_NUM_ITEMS)
_NCF_GLOBAL_MLP_SPEC = models.RecommenderSpec(
    'neural_cf', _NUM_ITEMS, _DIM, (3,), personal_score_layers=False
)


@pytest.fixture(scope='module', autouse=True)
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


def _client_data():
  """Three clients of different sizes (6, 3, 7 examples), with duplicates."""
  examples = [
      ([1, 2, 3, 1, 5, 7], [1, 0, 1, 0, 0, 1], [0, 1]),
      ([2, 9, 11], [1, 0, 0], [4, 2]),
      ([7, 7, 13, 15, 2, 0, 19], [1, 0, 1, 0, 0, 1, 0], [8, 3]),
  ]
  return [
      collections.OrderedDict(
          items=np.array(items, np.int32),
          labels=np.array(labels, np.float32),
          seed=np.array(seed, np.int64),
      )
      for items, labels, seed in examples
  ]


def _client_states(spec, initial_params):
  """Clients whose local parameters have moved away from the initial ones;
  client 1 also holds personal rows from an earlier round."""
  states = []
  for client in range(3):
    _, local = models.split_parameters(
        spec, models.initial_parameters(spec, seed=10 + client)
    )
    state = client_training.initial_client_state(
        spec, initial_params, _BROADCAST
    )
    state['local_parameters'] = local
    states.append(state)
  states[1]['personal_item_ids'] = np.array([2, 4], np.int32)
  states[1]['personal_item_rows'] = np.full([2, _DIM], 7.0, np.float32)
  return states


def _reference_round(spec, config, global_params, client_states, client_data):
  """PFedRec Algorithm 1, one round, one client at a time.

  Each client trains from the global parameters and its own local ones
  (ClientUpdate line 1-2; any personal rows it holds are not a starting
  point); the server adds the unweighted mean of the deltas (ServerExecute
  line 6).
  """
  deltas, new_states, loss_sums, counts = [], [], [], []
  for state, data in zip(client_states, client_data):
    params = models.merge_parameters(
        spec, global_params, state['local_parameters']
    )
    result = local_sgd.train_locally(
        spec,
        params,
        tf.constant(data['items']),
        tf.constant(data['labels']),
        batch_size=config.batch_size,
        local_epochs=config.local_epochs,
        learning_rate=config.learning_rate,
        item_learning_rate=config.item_learning_rate,
        alternating=config.dual_personalization,
        shuffle_seed=tf.constant(data['seed']),
    )
    trained = tf.nest.map_structure(np.asarray, result.parameters)
    new_global, new_local = models.split_parameters(spec, trained)
    deltas.append(tf.nest.map_structure(np.subtract, new_global, global_params))
    if config.dual_personalization:
      ids = np.unique(data['items'])
      rows = trained['item_embedding'][ids]
    else:
      ids = np.zeros([0], np.int32)
      rows = np.zeros([0, spec.embedding_dim], np.float32)
    new_states.append(
        collections.OrderedDict(
            local_parameters=new_local,
            personal_item_ids=ids,
            personal_item_rows=rows,
        )
    )
    loss_sums.append(float(result.loss_sum))
    counts.append(len(data['items']))
  mean_delta = tf.nest.map_structure(
      lambda *d: np.mean(np.stack(d), axis=0), *deltas
  )
  new_global = tf.nest.map_structure(np.add, global_params, mean_delta)
  train_loss = sum(loss_sums) / sum(counts)
  return new_global, new_states, train_loss, sum(counts)


def _assert_close(got, expected):
  tf.nest.assert_same_structure(
      tf.nest.map_structure(np.asarray, got), expected
  )
  tf.nest.map_structure(
      lambda g, e: np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5),
      got, expected,
  )


def _assert_client_state_close(got, expected):
  _assert_close(got['local_parameters'], expected['local_parameters'])
  # Compare personal rows as a set of (id, row), whatever their order.
  order = np.argsort(got['personal_item_ids'])
  np.testing.assert_array_equal(
      got['personal_item_ids'][order], expected['personal_item_ids']
  )
  np.testing.assert_allclose(
      got['personal_item_rows'][order], expected['personal_item_rows'],
      rtol=1e-5, atol=1e-5,
  )
  assert got['personal_item_rows'].shape == (
      len(expected['personal_item_ids']), _DIM
  )


def _run_round(
    spec, config, *, model_aggregator=None, item_aggregator=None,
    client_data=None, users_per_group=1, exchange=_BROADCAST,
):
  params = models.initial_parameters(spec, seed=0)
  process = client_training.build_process(
      spec, params, config, exchange, model_aggregator=model_aggregator,
      item_aggregator=item_aggregator,
  )
  server_state = process.initialize()
  client_states = _client_states(spec, params)
  client_data = client_data or _client_data()
  store = personal_rows.PersonalRowsStore(
      3, client_training.initial_client_state(spec, params, exchange)
  )
  store.put([0, 1, 2], client_states)
  # Only the local parameters go into a round (see the module docstring).
  new_server_state, metrics = user_groups.run_round(
      process, server_state, store, np.arange(3),
      sizes=[len(d['items']) for d in client_data],
      make_group_data=lambda positions: _group_data(
          [client_data[p] for p in positions], config),
      users_per_group=users_per_group,
  )
  return (params, server_state, client_states, client_data,
          new_server_state, store.get([0, 1, 2]), metrics)


def _group_data(user_data, config):
  """A group's compact tables; users that keep their trained rows keep all
  of them (`personal_rows.kept_rows`)."""
  data = compact_tables.group_client_data(user_data)
  if config.dual_personalization:
    data.update(personal_rows.kept_rows(
        data['row_ids'], data['num_rows'], [None] * len(user_data)))
  return data


def _names(struct_type):
  return [name for name, _ in tff.structure.iter_elements(struct_type)]


def test_type_signature():
  params = models.initial_parameters(_PFEDREC_SPEC, seed=0)
  process = client_training.build_process(
      _PFEDREC_SPEC, params, _CONFIG, _BROADCAST
  )

  initialize_type = process.initialize.type_signature
  next_type = process.next.type_signature

  assert initialize_type.parameter is None
  assert initialize_type.result.placement == tff.SERVER
  server_in, clients_in, data_in = next_type.parameter
  server_out, clients_out, metrics_out = next_type.result
  assert server_in.placement == tff.SERVER
  assert clients_in.placement == tff.CLIENTS
  assert data_in.placement == tff.CLIENTS
  assert server_out.placement == tff.SERVER
  assert clients_out.placement == tff.CLIENTS
  assert metrics_out.placement == tff.SERVER
  assert not clients_in.all_equal and not clients_out.all_equal
  assert not data_in.all_equal
  # S comes back in the type it went in, and so does C's local part L (the
  # only part a round reads), so rounds chain.
  assert server_out.member.is_equivalent_to(server_in.member)
  assert server_in.member.is_equivalent_to(initialize_type.result.member)
  assert _names(server_in.member) == [
      'global_parameters', 'distributor', 'aggregator', 'finalizer',
      'round_num',
  ]
  assert _names(clients_out.member) == [
      'local_parameters', 'personal_item_ids', 'personal_item_rows'
  ]
  local_out = clients_out.member[0]
  assert local_out.is_equivalent_to(clients_in.member)
  assert _names(clients_in.member) == ['score_layers']
  assert _names(data_in.member) == [
      'row_ids', 'num_rows', 'items', 'labels', 'num_examples', 'seeds',
      'kept_rows', 'num_kept_rows',
  ]
  assert _names(metrics_out.member) == [
      'train_loss', 'num_examples', 'client_work', 'aggregator',
      'finalizer', 'distributor',
  ]
  assert _names(metrics_out.member.aggregator) == ['item_embedding']
  # Only the declared global parameters travel to the server; the score
  # function (personal in PFedRec) stays in the client state.
  assert _names(server_in.member.global_parameters) == ['item_embedding']
  assert _names(clients_out.member[0]) == ['score_layers']


def test_initialize_holds_the_initial_global_parameters():
  (params, server_state, *_) = _run_round(_PFEDREC_SPEC, _CONFIG)

  global_params, _ = models.split_parameters(_PFEDREC_SPEC, params)
  _assert_close(server_state['global_parameters'], global_params)
  assert server_state['round_num'] == 0


@pytest.mark.parametrize('users_per_group', [1, 3])
def test_one_round_with_dual_personalization_matches_reference(
    users_per_group,
):
  (params, _, client_states, client_data, new_server_state, new_client_states,
   metrics) = _run_round(
       _PFEDREC_SPEC, _CONFIG, users_per_group=users_per_group
   )
  global_params, _ = models.split_parameters(_PFEDREC_SPEC, params)

  expected_global, expected_states, train_loss, num_examples = (
      _reference_round(
          _PFEDREC_SPEC, _CONFIG, global_params, client_states, client_data
      )
  )

  _assert_close(new_server_state['global_parameters'], expected_global)
  assert new_server_state['round_num'] == 1
  assert len(new_client_states) == 3
  for got, expected in zip(new_client_states, expected_states):
    _assert_client_state_close(got, expected)
  # Client 1's personal rows from the earlier round are replaced by the
  # rows of this round's items (2, 9, 11).
  np.testing.assert_array_equal(
      np.sort(new_client_states[1]['personal_item_ids']), [2, 9, 11]
  )
  np.testing.assert_allclose(metrics['train_loss'], train_loss, rtol=1e-5)
  assert metrics['num_examples'] == num_examples == 16


@pytest.mark.parametrize('users_per_group', [1, 3])
def test_multi_batch_two_epoch_clients_match_reference(users_per_group):
  config = client_training.ClientTrainingConfig(
      learning_rate=_CONFIG.learning_rate,
      item_learning_rate=_CONFIG.item_learning_rate,
      batch_size=2,
      local_epochs=2,
  )
  (params, _, client_states, client_data, new_server_state, new_client_states,
   _) = _run_round(_PFEDREC_SPEC, config, users_per_group=users_per_group)
  global_params, _ = models.split_parameters(_PFEDREC_SPEC, params)

  expected_global, expected_states, *_ = _reference_round(
      _PFEDREC_SPEC, config, global_params, client_states, client_data
  )

  for got, expected in zip(new_client_states, expected_states):
    _assert_client_state_close(got, expected)
  _assert_close(new_server_state['global_parameters'], expected_global)


def test_server_update_is_the_unweighted_mean():
  # Clients have 6, 3 and 7 examples: an example-weighted mean would differ.
  (params, _, client_states, client_data, new_server_state, *_) = _run_round(
      _PFEDREC_SPEC, _CONFIG
  )
  global_params, _ = models.split_parameters(_PFEDREC_SPEC, params)
  _, expected_states, *_ = _reference_round(
      _PFEDREC_SPEC, _CONFIG, global_params, client_states, client_data
  )

  # Each client's uploaded theta_i^m differs from the global only in the rows
  # it trained; those rows are its personal rows.
  uploads = []
  for state in expected_states:
    upload = global_params['item_embedding'].copy()
    upload[state['personal_item_ids']] = state['personal_item_rows']
    uploads.append(upload)
  weighted = np.average(
      uploads, axis=0, weights=[len(d['items']) for d in client_data]
  )

  got = new_server_state['global_parameters']['item_embedding']
  np.testing.assert_allclose(got, np.mean(uploads, axis=0), rtol=1e-5,
                             atol=1e-5)
  assert not np.allclose(got, weighted, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('users_per_group', [1, 2])
def test_one_round_without_dual_personalization_matches_reference(
    users_per_group,
):
  config = client_training.ClientTrainingConfig(
      learning_rate=_CONFIG.learning_rate,
      item_learning_rate=_CONFIG.item_learning_rate,
      batch_size=_CONFIG.batch_size,
      dual_personalization=False,
  )
  (params, _, client_states, client_data, new_server_state, new_client_states,
   metrics) = _run_round(
       _NCF_GLOBAL_MLP_SPEC, config, users_per_group=users_per_group
   )
  global_params, _ = models.split_parameters(_NCF_GLOBAL_MLP_SPEC, params)

  expected_global, expected_states, train_loss, _ = _reference_round(
      _NCF_GLOBAL_MLP_SPEC, config, global_params, client_states, client_data
  )

  assert tuple(new_server_state['global_parameters']) == (
      'item_embedding', 'score_layers'
  )
  _assert_close(new_server_state['global_parameters'], expected_global)
  # The shared MLP moved too.
  assert not np.allclose(
      new_server_state['global_parameters']['score_layers'][0]['kernel'],
      params['score_layers'][0]['kernel'],
  )
  for got, expected in zip(new_client_states, expected_states):
    _assert_client_state_close(got, expected)
    assert got['personal_item_ids'].shape == (0,)
    assert got['personal_item_rows'].shape == (0, _DIM)
  np.testing.assert_allclose(metrics['train_loss'], train_loss, rtol=1e-5)


class _PlusOneFactory(tff.aggregators.WeightedAggregationFactory):
  """Test double: the inner factory's result, then + 1 on every entry."""

  def __init__(self, inner_factory):
    self._inner_factory = inner_factory

  def create(self, value_type, weight_type):
    inner = self._inner_factory.create(value_type, weight_type)
    result_type = inner.next.type_signature.result.result.member

    @tff.tensorflow.computation(result_type)
    def add_one(value):
      return tf.nest.map_structure(lambda x: x + 1.0, value)

    @tff.federated_computation(
        inner.initialize.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS),
    )
    def next_fn(state, value, weight):
      output = inner.next(state, value, weight)
      return tff.templates.MeasuredProcessOutput(
          state=output.state,
          result=tff.federated_map(add_one, output.result),
          measurements=output.measurements,
      )

    return tff.templates.AggregationProcess(inner.initialize, next_fn)


def _plus_one(structure):
  return tf.nest.map_structure(lambda x: x + 1.0, structure)


def test_model_aggregator_is_used_for_the_shared_dense_parameters():
  (params, _, client_states, client_data, new_server_state, *_) = _run_round(
      _NCF_GLOBAL_MLP_SPEC, _CONFIG,
      model_aggregator=_PlusOneFactory(tff.aggregators.MeanFactory()),
  )
  global_params, _ = models.split_parameters(_NCF_GLOBAL_MLP_SPEC, params)
  expected, *_ = _reference_round(
      _NCF_GLOBAL_MLP_SPEC, _CONFIG, global_params, client_states, client_data
  )
  # The server applies what the aggregator returns: mean delta + 1 on the
  # MLP, while the item rows go through the (untouched) item aggregator.
  expected['score_layers'] = _plus_one(expected['score_layers'])
  _assert_close(new_server_state['global_parameters'], expected)


def test_item_aggregator_is_used_for_the_item_rows():
  (params, _, client_states, client_data, new_server_state, *_) = _run_round(
      _NCF_GLOBAL_MLP_SPEC, _CONFIG,
      item_aggregator=_PlusOneFactory(
          sparse_rows.RowSparseMeanFactory(_NUM_ITEMS)
      ),
  )
  global_params, _ = models.split_parameters(_NCF_GLOBAL_MLP_SPEC, params)
  expected, *_ = _reference_round(
      _NCF_GLOBAL_MLP_SPEC, _CONFIG, global_params, client_states, client_data
  )
  expected['item_embedding'] = _plus_one(expected['item_embedding'])
  _assert_close(new_server_state['global_parameters'], expected)


_NOISE_CONFIG = client_training.ClientTrainingConfig(
    learning_rate=_CONFIG.learning_rate,
    item_learning_rate=_CONFIG.item_learning_rate,
    batch_size=_CONFIG.batch_size,
)


def _noisy_round(scale, **kwargs):
  return _run_round(
      _PFEDREC_SPEC, _NOISE_CONFIG,
      exchange=exchanges.BroadcastExchange(_NUM_ITEMS, ldp_noise_scale=scale),
      **kwargs,
  )


@pytest.mark.parametrize('users_per_group', [1, 2])
def test_ldp_noise_changes_the_global_update_only(users_per_group):
  scale = 0.5
  clean = _noisy_round(0.0)
  noisy = _noisy_round(scale, users_per_group=users_per_group)
  clean_global = clean[4]['global_parameters']['item_embedding']
  noisy_global = noisy[4]['global_parameters']['item_embedding']

  # The clients keep their un-noised training results.
  for got, expected in zip(noisy[5], clean[5]):
    _assert_close(got, expected)
  # The server sees the mean of 3 clients' Laplace(0, b) noise on every entry
  # (also rows a client did not train): variance 2 b^2 / 3 = 1/6. Over the
  # 80 entries the sample variance is within a factor 2 with a wide margin.
  difference = noisy_global - clean_global
  assert np.all(difference != 0.0)
  assert 0.5 < difference.var() / (2 * scale**2 / 3) < 2.0
  # The metrics are of the training, not of the noise.
  np.testing.assert_allclose(
      noisy[6]['train_loss'], clean[6]['train_loss'], rtol=1e-6
  )


def test_ldp_noise_is_deterministic_given_the_data_seeds():
  first = _noisy_round(0.5)
  again = _noisy_round(0.5)
  # Each user draws its own noise, whatever group it is simulated in.
  grouped = _noisy_round(0.5, users_per_group=3)
  np.testing.assert_allclose(
      grouped[4]['global_parameters']['item_embedding'],
      first[4]['global_parameters']['item_embedding'],
      rtol=1e-5, atol=1e-5,
  )
  other_data = _client_data()
  other_data[0]['seed'] = np.array([123, 456], np.int64)
  other = _noisy_round(0.5, client_data=other_data)

  np.testing.assert_array_equal(
      first[4]['global_parameters']['item_embedding'],
      again[4]['global_parameters']['item_embedding'],
  )
  # With one local epoch the seed only drives the noise: client 0's training
  # result is the same, the global update is not.
  _assert_close(other[5][0], first[5][0])
  assert not np.allclose(
      other[4]['global_parameters']['item_embedding'],
      first[4]['global_parameters']['item_embedding'],
  )


def _assert_each_is_one_of(values, allowed):
  gaps = np.abs(np.ravel(values)[:, None] - np.asarray(allowed)[None])
  assert np.all(gaps.min(axis=1) < 1e-5), (values, allowed)
  assert np.all(gaps.min(axis=0) < 1e-5), 'every allowed value is used'


def test_each_users_upload_is_its_real_rows_and_layers_encoded_by_tier():
  """User 0 (1-bit Quant) sends its 2 real rows' deltas as their min and
  max (positive deltas: a range that took in its padded row's 0 would be
  wrong), user 1 (prune 0.5) each element or 0, user 2 (untouched) all of
  them; padded rows stay at the start; bytes are the real rows' messages.
  """
  rng = np.random.default_rng(0)
  start = collections.OrderedDict(
      item_embedding=rng.normal(size=(3, 3, 2)).astype(np.float32),
      score_layers=rng.normal(size=(3, 4)).astype(np.float32))
  deltas = tf.nest.map_structure(
      lambda x: rng.uniform(1.0, 2.0, size=x.shape).astype(np.float32), start)
  trained = tf.nest.map_structure(np.add, start, deltas)
  data = {'tier': np.array([0, 1, 2], np.int32),
          'seeds': np.array([[1, 2], [3, 4], [5, 6]], np.int64),
          'num_rows': np.array([2, 3, 1], np.int32)}
  codecs = (tier_codecs.UpdateCodec('quant', 1),
            tier_codecs.UpdateCodec('prune', 0.5), tier_codecs.UpdateCodec())
  uploaded, figures = client_training.encode_upload(codecs, start, trained,
                                                    data)
  sent = tf.nest.map_structure(lambda u, s: u.numpy() - s, uploaded, start)
  rows = sent['item_embedding']
  real = deltas['item_embedding'][0, :2]
  _assert_each_is_one_of(rows[0, :2], [real.min(), real.max()])
  layers = deltas['score_layers'][0]
  _assert_each_is_one_of(sent['score_layers'][0],
                         [layers.min(), layers.max()])
  kept = rows[1] != 0
  np.testing.assert_allclose(rows[1][kept], deltas['item_embedding'][1][kept],
                             rtol=1e-5)
  assert 0 < kept.sum() < kept.size
  np.testing.assert_allclose(rows[2, :1], deltas['item_embedding'][2, :1],
                             rtol=1e-5)
  np.testing.assert_array_equal(rows[0, 2:], 0.0)
  np.testing.assert_array_equal(rows[2, 1:], 0.0)
  pruned_layers = (sent['score_layers'][1] != 0).sum()
  np.testing.assert_allclose(figures['tier_upload_bytes'], [
      (1 + 8) + (1 + 8),  # ceil(4 x 1 / 8) + min and max, per tensor.
      4 * (kept.sum() + pruned_layers) + 2 * 8,  # Kept floats, mask seed.
      4 * (2 + 4),  # One row of 2 and 4 layer values, 32-bit.
  ])
  np.testing.assert_array_equal(figures['tier_users'], [1, 1, 1])
