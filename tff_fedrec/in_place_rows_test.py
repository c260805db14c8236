import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import in_place_rows
from tff_fedrec.programs import execution


def _numpy_steps(table, rows, updates, rate):
  """Reference: each step reads its rows (after every earlier step's
  subtraction) and subtracts rate * (rows read) * updates, duplicates
  accumulating in order, one user at a time."""
  table = table.copy()
  reads = []
  for step_rows, step_updates in zip(rows, updates):
    read = np.stack([table[u, step_rows[u]] for u in range(table.shape[0])])
    reads.append(read)
    for u in range(table.shape[0]):
      for b, row in enumerate(step_rows[u]):
        table[u, row] -= rate * read[u, b] * step_updates[u, b]
  return table, np.stack(reads)


def _steps_in_a_loop(table, rows, updates, rate):
  """The same steps through a RowTable inside a tf.while_loop: a step's
  update depends on what it read, so a read that ran before the previous
  step's subtraction (or a subtraction lost) changes the result."""
  rows = tf.convert_to_tensor(rows)
  updates = tf.convert_to_tensor(updates)
  table_in_place = in_place_rows.RowTable(table)

  def body(step, reads):
    read = table_in_place.gather(rows[step])
    table_in_place.subtract(rows[step], rate * read * updates[step])
    return step + 1, reads.write(step, read)

  _, reads = tf.while_loop(
      lambda step, _: step < tf.shape(rows)[0], body,
      (tf.constant(0), tf.TensorArray(tf.float32, size=tf.shape(rows)[0])),
  )
  return table_in_place.read(), reads.stack()


def _inputs(seed=0, users=3, rows_per_user=5, dim=2, steps=4, batch=6):
  rng = np.random.default_rng(seed)
  table = rng.standard_normal([users, rows_per_user, dim]).astype(np.float32)
  # Few rows, many draws: duplicates within a batch and across steps.
  rows = rng.integers(0, rows_per_user, [steps, users, batch]).astype(np.int32)
  updates = rng.standard_normal([steps, users, batch, 1]).astype(np.float32)
  return table, rows, updates


def test_steps_read_every_earlier_update_and_duplicates_accumulate():
  table, rows, updates = _inputs()
  expected, expected_reads = _numpy_steps(table, rows, updates, 0.5)
  got, reads = tf.function(_steps_in_a_loop)(table, rows, updates, 0.5)
  np.testing.assert_allclose(reads, expected_reads, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
  # Duplicate rows of one user in one batch do occur in these inputs.
  assert any(len(set(r)) < len(r) for step in rows for r in step)


def test_matches_tensor_scatter_nd_sub_bit_for_bit():
  rng = np.random.default_rng(1)
  table = rng.standard_normal([4, 30, 8]).astype(np.float32)
  rows = rng.integers(0, 30, [4, 64]).astype(np.int32)
  updates = rng.standard_normal([4, 64, 8]).astype(np.float32)
  users = np.broadcast_to(np.arange(4)[:, None], rows.shape)
  expected = tf.tensor_scatter_nd_sub(
      table, np.stack([users, rows], axis=-1), updates)

  @tf.function
  def in_place():
    row_table = in_place_rows.RowTable(table)
    row_table.subtract(rows, updates)
    return row_table.read()

  np.testing.assert_array_equal(in_place(), expected)


def test_each_run_and_each_table_has_its_own_rows():
  table, rows, updates = _inputs(seed=2)

  @tf.function
  def two_tables(table):
    first = in_place_rows.RowTable(table)
    second = in_place_rows.RowTable(table)
    first.subtract(rows[0], updates[0])
    return first.read(), second.read()

  first, second = two_tables(table)
  np.testing.assert_array_equal(second, table)
  assert not np.array_equal(first, table)
  # A second run starts from its input again, not from the first's rows.
  again, _ = two_tables(table)
  np.testing.assert_array_equal(again, first)


@pytest.fixture(scope='module')
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


def test_clients_of_a_tff_worker_update_their_own_tables(tff_worker):
  del tff_worker
  table, rows, updates = _inputs(seed=3)
  expected, _ = _numpy_steps(table, rows, updates, 0.5)
  shifted, _ = _numpy_steps(table + 1.0, rows, updates, 0.5)

  @tff.tensorflow.computation(
      tff.TensorType(np.float32, table.shape),
  )
  def train(start):
    return tf.function(_steps_in_a_loop)(start, rows, updates, 0.5)[0]

  @tff.federated_computation(
      tff.FederatedType(tff.TensorType(np.float32, table.shape),
                        tff.CLIENTS))
  def round_(starts):
    return tff.federated_map(train, starts)

  got = round_([table, table + 1.0, table])
  np.testing.assert_allclose(got[0], expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[1], shifted, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[2], expected, rtol=1e-5, atol=1e-5)


def test_a_graph_without_automatic_control_dependencies_is_refused():
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match='inside a tf.function'):
      in_place_rows.RowTable(tf.zeros([1, 2, 2]))
