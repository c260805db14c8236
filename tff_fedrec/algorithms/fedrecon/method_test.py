import collections
import types

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec.algorithms import method as method_lib
from tff_fedrec.algorithms.fedrecon import method as fedrecon
from tff_fedrec.algorithms.fedrecon import reconstruction
from tff_fedrec.algorithms.local_items import client_training
from tff_fedrec.programs import execution

_NUM_ITEMS, _DIM, _BATCH = 12, 3, 4
_TRAINING = client_training.ClientTrainingConfig(
    learning_rate=0.3, item_learning_rate=2.0, batch_size=_BATCH,
    dual_personalization=False,
)


@pytest.fixture(scope='module', autouse=True)
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


def _sigmoid(x):
  return 1 / (1 + np.exp(-x))


def _reference_client_delta(table, initial_user, items, labels):
  """FedRecon's client: reconstruct p_u with q frozen, then SGD on q with
  p_u frozen (one epoch each, batches in order); returns q_new - q."""
  offsets = np.array([0, items.size])
  p = reconstruction.reconstruct_user_embeddings(
      table, offsets, items, labels, initial_user,
      learning_rate=_TRAINING.learning_rate, batch_size=_BATCH,
  )[0].astype(np.float64)
  q = table.astype(np.float64).copy()
  for start in range(0, items.size, _BATCH):
    batch_items = items[start:start + _BATCH]
    residual = _sigmoid(q[batch_items] @ p) - labels[start:start + _BATCH]
    gradient = np.zeros_like(q)
    np.add.at(gradient, batch_items, residual[:, None] * p[None, :])
    q -= _TRAINING.item_learning_rate * gradient / batch_items.size
  return q - table


def _run_data(num_users, num_items=_NUM_ITEMS):
  return method_lib.RunData(
      num_users, num_items, np.zeros([num_users + 1], np.int64),
      np.zeros([0], np.int32))


def test_one_round_equals_the_reference_and_the_mean_is_uniform():
  method = fedrecon.build_fedrecon(
      data=_run_data(3), embedding_dim=_DIM, training=_TRAINING, seed=1
  )
  rng = np.random.default_rng(0)
  clients = []
  for size in (6, 3, 9):  # unequal sizes: a weighted mean would differ
    clients.append((rng.integers(0, _NUM_ITEMS, size).astype(np.int32),
                    (rng.random(size) < 0.5).astype(np.float32)))
  state = method.process.initialize()
  table = method.global_parameters(state)['item_embedding']
  np.testing.assert_allclose(table, method.initial_parameters['item_embedding'])
  datasets = [
      tf.data.Dataset.from_tensor_slices(
          collections.OrderedDict(x=items, y=labels)).batch(_BATCH)
      for items, labels in clients
  ]
  new_table = method.global_parameters(
      method.process.next(state, datasets).state
  )['item_embedding']
  deltas = [
      _reference_client_delta(
          table, method.initial_parameters['user_embedding'], items, labels
      )
      for items, labels in clients
  ]
  np.testing.assert_allclose(
      new_table, table + np.mean(deltas, axis=0), rtol=1e-4, atol=1e-5
  )


@pytest.mark.parametrize('kwargs, message', [
    ({'hidden_units': (4,)}, 'hidden_units'),
    ({'training': client_training.ClientTrainingConfig(
        dual_personalization=False, local_epochs=2)}, 'one local epoch'),
])
def test_unsupported_options_are_refused(kwargs, message):
  with pytest.raises(ValueError, match=message):
    fedrecon.build_fedrecon(data=_run_data(2, num_items=5), **kwargs)


@pytest.mark.parametrize('dual_personalization', [False, True])
def test_run_round_stores_what_each_user_scores_with(dual_personalization):
  training = client_training.ClientTrainingConfig(
      learning_rate=_TRAINING.learning_rate,
      item_learning_rate=_TRAINING.item_learning_rate,
      batch_size=_BATCH,
      dual_personalization=dual_personalization,
  )
  method = fedrecon.build_fedrecon(
      data=_run_data(2), embedding_dim=_DIM, training=training, seed=1
  )
  rng = np.random.default_rng(3)
  counts = np.array([6, 5])
  items = rng.integers(0, _NUM_ITEMS, counts.sum()).astype(np.int32)
  labels = (rng.random(counts.sum()) < 0.5).astype(np.float32)
  offsets = np.concatenate([[0], np.cumsum(counts)])
  # The round's examples as the program passes them (TrainingExamples).
  examples = types.SimpleNamespace(offsets=offsets, items=items, labels=labels)
  client_data = [
      collections.OrderedDict(items=items[a:b], labels=labels[a:b],
                              seed=np.zeros(2, np.int64))
      for a, b in zip(offsets[:-1], offsets[1:])
  ]
  store = method.initial_store()

  result = method.run_round(
      method.process.initialize(), store,
      method_lib.RoundInput(0, np.arange(2), client_data, examples, 0),
  )

  table = method.global_parameters(result.server_state)['item_embedding']
  for user, state in enumerate(store.get([0, 1])):
    user_items, user_labels = items[offsets[user]:offsets[user + 1]], labels[
        offsets[user]:offsets[user + 1]]
    # p_u reconstructed on the new global table.
    expected_p = reconstruction.reconstruct_user_embeddings(
        table, np.array([0, user_items.size]), user_items, user_labels,
        method.initial_parameters['user_embedding'],
        learning_rate=training.learning_rate, batch_size=_BATCH,
    )[0]
    np.testing.assert_allclose(
        state['local_parameters']['user_embedding'], expected_p, rtol=1e-5
    )
    if not dual_personalization:
      assert state['personal_item_ids'].size == 0
      continue
    # The rows of the user's items after its post-reconstruction step.
    fine_tuned = table + _reference_client_delta(
        table, method.initial_parameters['user_embedding'], user_items,
        user_labels,
    )
    np.testing.assert_array_equal(
        state['personal_item_ids'], np.unique(user_items)
    )
    np.testing.assert_allclose(
        state['personal_item_rows'], fine_tuned[np.unique(user_items)],
        rtol=1e-4, atol=1e-5,
    )
