import io

import numpy as np
import pytest

from tff_fedrec import csr


def _npy_bytes(write) -> bytes:
  buffer = io.BytesIO()
  write(buffer)
  return buffer.getvalue()


@pytest.mark.parametrize('pieces', [
    # Per-user rows [T_u, d], some users with none, one not contiguous.
    [np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros([0, 3], np.float32),
     np.arange(12, dtype=np.float32).reshape(3, 4)[:, :3] * -1.5],
    # Per-user ids, int32.
    [np.array([4, 1], np.int32), np.array([7], np.int32),
     np.zeros([0], np.int32)],
    # Every user empty.
    [np.zeros([0, 2], np.float32)] * 3,
])
def test_pieces_write_the_bytes_np_save_writes_for_their_concatenation(pieces):
  values = csr.ValuesInPieces(pieces)
  expected = np.concatenate(pieces)
  assert values.shape == expected.shape and values.dtype == expected.dtype
  np.testing.assert_array_equal(np.asarray(values), expected)
  assert _npy_bytes(values.write_npy) == _npy_bytes(
      lambda f: np.save(f, expected, allow_pickle=False))


def test_the_pieces_are_a_snapshot_of_the_list_not_of_its_arrays():
  field = [np.ones([1, 2], np.float32), np.ones([2, 2], np.float32)]
  values = csr.ValuesInPieces(field)
  field[0] = np.full([5, 2], 9.0, np.float32)  # A put replaces the array.
  assert values.shape == (3, 2)
  np.testing.assert_array_equal(np.asarray(values), np.ones([3, 2]))


@pytest.mark.parametrize('pieces, problem', [
    ([np.zeros([1, 2], np.float32), np.zeros([1, 3], np.float32)], 'do not'),
    ([np.zeros([1], np.float32), np.zeros([1], np.int32)], 'do not'),
    ([], 'at least one'),
])
def test_pieces_that_make_no_one_array_are_refused(pieces, problem):
  with pytest.raises(ValueError, match=problem):
    csr.ValuesInPieces(pieces)
