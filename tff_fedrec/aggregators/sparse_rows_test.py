import numpy as np
import pytest
import tensorflow_federated as tff

from tff_fedrec.aggregators import sparse_rows
from tff_fedrec.programs import execution


@pytest.fixture(scope='module', autouse=True)
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


_WEIGHT = tff.TensorType(np.float32)


def _upload(ids, values, dim=2):
  return {
      'row_ids': np.asarray(ids, np.int32),
      'row_values': np.asarray(values, np.float32).reshape([len(ids), dim]),
  }


def test_mean_over_clients_of_their_rows_with_duplicates_and_empty_uploads():
  process = sparse_rows.RowSparseMeanFactory(num_rows=4).create(
      sparse_rows.row_sparse_type(2), _WEIGHT
  )
  output = process.next(
      process.initialize(),
      [
          _upload([0, 0], [[1, 2], [3, 4]]),  # duplicates add: row 0 += [4, 6]
          _upload([3], [[6, 3]]),
          _upload([], []),  # a client that touched no row still counts
      ],
      [1.0, 1.0, 1.0],
  )
  # Dense deltas averaged over the 3 clients: row 0 = [4, 6] / 3,
  # row 3 = [6, 3] / 3, rows 1 and 2 untouched.
  np.testing.assert_allclose(
      output.result,
      [[4 / 3, 2], [0, 0], [0, 0], [2, 1]],
      rtol=1e-6,
  )
  assert output.measurements['uploaded_rows'] == 3


def test_equals_the_weighted_mean_of_dense_deltas_on_random_uploads():
  rng = np.random.default_rng(0)
  num_rows, dim = 7, 3
  uploads, dense = [], []
  for _ in range(5):
    ids = rng.choice(num_rows, size=rng.integers(0, num_rows), replace=False)
    values = rng.normal(size=(ids.size, dim))
    uploads.append(_upload(ids, values, dim))
    table = np.zeros([num_rows, dim])
    table[ids] = values
    dense.append(table)
  weights = rng.integers(1, 5, size=len(uploads)).astype(np.float32)
  process = sparse_rows.RowSparseMeanFactory(num_rows).create(
      sparse_rows.row_sparse_type(dim), _WEIGHT
  )
  result = process.next(process.initialize(), uploads, list(weights)).result
  np.testing.assert_allclose(
      result, np.average(dense, axis=0, weights=weights), atol=1e-6
  )


def test_rejects_a_value_that_is_not_row_sparse():
  factory = sparse_rows.RowSparseMeanFactory(num_rows=3)
  with pytest.raises(TypeError, match='row_ids'):
    factory.create(
        tff.to_type({
            'ids': tff.TensorType(np.int32, [None]),
            'row_values': tff.TensorType(np.float32, [None, 2]),
        }),
        _WEIGHT,
    )
  with pytest.raises(TypeError, match='float32 weight'):
    factory.create(sparse_rows.row_sparse_type(2), tff.TensorType(np.int32))
  with pytest.raises(ValueError, match='num_rows'):
    sparse_rows.RowSparseMeanFactory(num_rows=0)
