import numpy as np

from tff_fedrec.algorithms.fedrecon import reconstruction


def _per_user_reference(items_table, offsets, items, labels, initial, lr, bs,
                        epochs=1):
  """Plain loops: each user's minibatch SGD on its own examples in order."""
  out = []
  for u in range(offsets.size - 1):
    p = np.array(initial, np.float64)
    user_items = items[offsets[u]:offsets[u + 1]]
    user_labels = labels[offsets[u]:offsets[u + 1]]
    for _ in range(epochs):
      for start in range(0, user_items.size, bs):
        q = items_table[user_items[start:start + bs]].astype(np.float64)
        y = user_labels[start:start + bs]
        residual = 1 / (1 + np.exp(-(q @ p))) - y
        p = p - lr * (residual[:, None] * q).mean(axis=0)
    out.append(p)
  return np.array(out)


def test_matches_a_per_user_loop_with_ragged_batches():
  rng = np.random.default_rng(0)
  num_items, dim = 30, 4
  table = rng.normal(size=(num_items, dim)).astype(np.float32)
  # A user without examples keeps the start; user 4's last batch holds one
  # example.
  counts = np.array([7, 0, 3, 12, 5])
  offsets = np.concatenate([[0], np.cumsum(counts)])
  items = rng.integers(0, num_items, counts.sum())
  labels = (rng.random(counts.sum()) < 0.4).astype(np.float32)
  initial = rng.normal(size=dim).astype(np.float32)
  got = reconstruction.reconstruct_user_embeddings(
      table, offsets, items, labels, initial,
      learning_rate=0.5, batch_size=4, epochs=2,
  )
  expected = _per_user_reference(table, offsets, items, labels, initial, 0.5,
                                 4, epochs=2)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got[1], initial)


def test_one_step_by_hand():
  # p = 0: sigmoid(0) = 1/2. Examples (q=[1,0], y=1) and (q=[0,2], y=0):
  # gradient = mean([(-1/2)*[1,0], (1/2)*[0,2]]) = [-1/4, 1/2];
  # p <- 0 - 2 * [-1/4, 1/2] = [1/2, -1].
  table = np.array([[1.0, 0.0], [0.0, 2.0]], np.float32)
  got = reconstruction.reconstruct_user_embeddings(
      table, np.array([0, 2]), np.array([0, 1]), np.array([1.0, 0.0]),
      np.zeros(2, np.float32), learning_rate=2.0, batch_size=2,
  )
  np.testing.assert_allclose(got, [[0.5, -1.0]], atol=1e-7)


def _fine_tune_reference(table, offsets, items, labels, users, lr, bs):
  """Plain loops: each user's SGD on its own copy of the table, p_u fixed."""
  out = []
  for u in range(offsets.size - 1):
    q = table.astype(np.float64).copy()
    user_items = items[offsets[u]:offsets[u + 1]]
    user_labels = labels[offsets[u]:offsets[u + 1]]
    p = users[u].astype(np.float64)
    for start in range(0, user_items.size, bs):
      batch = user_items[start:start + bs]
      residual = 1 / (1 + np.exp(-(q[batch] @ p))) - user_labels[start:start + bs]
      gradient = np.zeros_like(q)
      np.add.at(gradient, batch, residual[:, None] * p / batch.size)
      q -= lr * gradient
    ids = np.unique(user_items)
    out.append((ids, q[ids]))
  return out


def test_fine_tuned_rows_match_a_per_user_loop():
  rng = np.random.default_rng(1)
  num_items, dim = 10, 3
  table = rng.normal(size=(num_items, dim)).astype(np.float32)
  counts = np.array([9, 0, 4, 6])
  offsets = np.concatenate([[0], np.cumsum(counts)])
  # Few items, so users repeat items within and across batches.
  items = rng.integers(0, num_items, counts.sum())
  labels = (rng.random(counts.sum()) < 0.4).astype(np.float32)
  users = rng.normal(size=(4, dim)).astype(np.float32)

  row_offsets, ids, rows = reconstruction.fine_tune_item_rows(
      table, offsets, items, labels, users, learning_rate=0.7, batch_size=4
  )

  expected = _fine_tune_reference(table, offsets, items, labels, users, 0.7, 4)
  for u, (expected_ids, expected_rows) in enumerate(expected):
    span = slice(row_offsets[u], row_offsets[u + 1])
    np.testing.assert_array_equal(ids[span], expected_ids)
    np.testing.assert_allclose(rows[span], expected_rows, rtol=1e-5,
                               atol=1e-6)
  assert row_offsets.shape == (counts.size + 1,)
  assert row_offsets[-1] == ids.size
  assert row_offsets[1] == row_offsets[2]  # user 1 has no rows
  # Rows moved away from the global ones.
  assert not np.allclose(rows, table[ids])
