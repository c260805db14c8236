"""The tiered methods' driver: client state, held-out examples, bytes, and
the scores of each user's own model."""

import numpy as np

from tff_fedrec.algorithms import method as method_lib
from tff_fedrec.algorithms.hetefedrec import models as hetero_models
from tff_fedrec.algorithms.hetefedrec import process
from tff_fedrec.algorithms.hetefedrec import tiered_method
from tff_fedrec.programs import execution


def _run_data(num_users=6, num_items=10):
  rng = np.random.default_rng(0)
  counts = np.arange(1, num_users + 1)
  return method_lib.RunData(
      num_users, num_items, np.concatenate([[0], np.cumsum(counts)]),
      rng.integers(0, num_items, counts.sum()).astype(np.int32),
      user_tiers=np.array([0, 0, 1, 1, 2, 2])[:num_users],
  )


def test_bytes_per_client_follow_table_iii():
  options = dict(widths=(2, 4, 8), hidden_units=(3,))
  config = process.HeteroConfig(distillation_items=0)
  theta = lambda width: 4 * ((2 * width * 3 + 3) + (3 * 1 + 1))
  table = lambda width: 4 * 10 * width

  sent = tiered_method.build_hetefedrec(
      data=_run_data(), training=config, **options).bytes_per_client()
  # HeteFedRec: V_a plus Theta_b for every b <= a (UDL).
  assert sent['small']['download'] == table(2) + theta(2)
  assert sent['medium']['download'] == table(4) + theta(2) + theta(4)
  assert sent['large']['download'] == table(8) + theta(2) + theta(4) + theta(8)
  assert all(s['upload'] == s['download'] for s in sent.values())

  small = tiered_method.build_all_small(
      data=_run_data(), training=config, **options).bytes_per_client()
  assert all(s['download'] == table(2) + theta(2) for s in small.values())
  exclusive = tiered_method.build_all_large_exclusive(
      data=_run_data(), training=config, **options).bytes_per_client()
  assert exclusive['small']['upload'] == 0
  assert exclusive['small']['download'] == table(8) + theta(8)


def test_held_out_examples_take_a_tenth_rounded_up_but_never_everything():
  rng = np.random.default_rng(0)
  masks = tiered_method.held_out_examples([80, 9, 1, 5], 0.1, rng)
  assert [int(m.sum()) for m in masks] == [8, 1, 0, 1]
  assert [m.size for m in masks] == [80, 9, 1, 5]
  # The draw is random: two rounds hold out different examples.
  again = tiered_method.held_out_examples([80], 0.1, rng)
  assert not np.array_equal(again[0], masks[0])
  assert all(not m.any() for m in tiered_method.held_out_examples(
      [80, 9], 0.0, rng))


def test_initial_store_zeroes_each_users_embedding_beyond_its_width():
  method = tiered_method.build_hetefedrec(
      data=_run_data(), widths=(2, 3, 5), hidden_units=(3,))
  users = method.initial_store().stacked_local_parameters(np.arange(6))['user']
  # Users 0-1 small (2 wide), 2-3 medium (3), 4-5 large (5).
  for user, width in enumerate([2, 2, 3, 3, 5, 5]):
    assert np.all(users[user, width:] == 0)
    assert np.all(users[user, :width] != 0)
  all_large = tiered_method.build_all_large(
      data=_run_data(), widths=(2, 3, 5), hidden_units=(3,))
  assert np.all(all_large.initial_store().stacked_local_parameters(
      np.arange(6))['user'] != 0)


def test_standalone_keeps_a_partition_of_whole_models_per_tier():
  method = tiered_method.build_standalone(
      data=_run_data(), widths=(2, 3, 5), hidden_units=(3,))
  store = method.initial_store()
  small = store.stacked_local_parameters(np.array([0, 1]))
  large = store.stacked_local_parameters(np.array([5]))
  assert small['model']['item_table'].shape == (2, 10, 2)
  assert large['model']['item_table'].shape == (1, 10, 5)
  assert method.on_device_tiers() == []


def test_scores_are_each_users_own_model_over_every_item():
  data = _run_data()
  method = tiered_method.build_all_small(
      data=data, widths=(2, 3, 5), hidden_units=(3,))
  store = method.initial_store()
  with execution.worker_execution_context():
    state = method.process.initialize()
  users = np.array([4, 0, 2])
  scores = method.score(state, store, method_lib.CandidateItems(users))
  params = state['global_parameters']
  for row, user in enumerate(users):
    vector = store.stacked_local_parameters(np.array([user]))['user'][:, :2]
    want = hetero_models.score_all_items(
        vector, params['item_tables'][0], params['score_layers'][0]).numpy()
    np.testing.assert_allclose(scores[row], want[0], rtol=1e-6)
  candidates = np.array([[3, 1], [0, 9], [2, 2]])
  np.testing.assert_array_equal(
      method.score(state, store,
                   method_lib.CandidateItems(users, candidates)),
      np.take_along_axis(scores, candidates, axis=1))
