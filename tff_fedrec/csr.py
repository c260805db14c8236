"""Per-user lists in CSR form: offsets [U + 1] into one values array.

User u's values are values[offsets[u]:offsets[u + 1]], the layout of the
training items, test items and training examples throughout the project.
`ValuesInPieces` is such a values array kept as its users' pieces, for
writing without building it.
"""

import numpy as np


def rows_of(offsets: np.ndarray, values: np.ndarray, users) -> tuple:
  """The CSR rows of `users` (in that order) as a new (offsets, values).

  Example: offsets [0, 2, 3, 5], values [a, b, c, d, e] and users [2, 0]
  give offsets [0, 2, 4] and values [d, e, a, b].
  """
  users = np.asarray(users, np.int64)
  offsets = np.asarray(offsets, np.int64)
  counts = offsets[users + 1] - offsets[users]
  new_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
  # Row r's values start at offsets[users[r]]: each position's distance
  # from its row's new start, plus that.
  index = (np.repeat(offsets[users] - new_offsets[:-1], counts)
           + np.arange(new_offsets[-1], dtype=np.int64))
  return new_offsets, values[index]


class ValuesInPieces:
  """A CSR values array [sum T_u, ...] kept as its users' pieces [T_u, ...]
  (same dtype and trailing shape), never built whole unless asked:
  `write_npy` writes it to a .npy file piece by piece, so a checkpoint of
  gigabytes of per-user rows costs no copy of them (the array a
  concatenation would make is as large as the rows themselves: 2.9 GB for
  6,040 users' own ML-1M tables); `np.asarray` builds it.

  The pieces are the caller's arrays, read when written: a piece replaced
  in the caller's list afterwards does not change this one, a piece
  changed in place does.

  Example:
    >>> values = ValuesInPieces([np.ones([2, 3]), np.zeros([0, 3])])
    >>> values.shape, np.asarray(values).sum()
    ((2, 3), 6.0)
  """

  def __init__(self, pieces):
    self._pieces = [np.asarray(piece) for piece in pieces]
    if not self._pieces:
      raise ValueError('ValuesInPieces needs at least one piece (its dtype '
                       'and trailing shape).')
    first = self._pieces[0]
    for piece in self._pieces:
      if piece.dtype != first.dtype or piece.shape[1:] != first.shape[1:]:
        raise ValueError(
            f'Pieces of {first.dtype} {first.shape[1:]} and {piece.dtype} '
            f'{piece.shape[1:]} do not make one array.')
    self.dtype = first.dtype
    self.shape = (sum(len(piece) for piece in self._pieces),
                  *first.shape[1:])

  def __array__(self, dtype=None):
    values = np.concatenate(self._pieces)
    return values if dtype is None else values.astype(dtype)

  def write_npy(self, file) -> None:
    """Writes the array to the open binary `file` in .npy format, as
    `np.save(file, np.asarray(self))` would, one piece at a time."""
    header = {'descr': np.lib.format.dtype_to_descr(self.dtype),
              'fortran_order': False, 'shape': self.shape}
    try:
      np.lib.format.write_array_header_1_0(file, header)
    except ValueError:  # A header over 64 KiB.
      np.lib.format.write_array_header_2_0(file, header)
    for piece in self._pieces:
      file.write(np.ascontiguousarray(piece).data)
