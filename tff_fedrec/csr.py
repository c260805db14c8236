"""Per-user lists in CSR form: offsets [U + 1] into one values array.

User u's values are values[offsets[u]:offsets[u + 1]], the layout of the
training items, test items and training examples throughout the project.
"""

import numpy as np


def rows_of(offsets: np.ndarray, values: np.ndarray, users) -> tuple:
  """The CSR rows of `users` (in that order) as a new (offsets, values).

  Example: offsets [0, 2, 3, 5], values [a, b, c, d, e] and users [2, 0]
  give offsets [0, 2, 4] and values [d, e, a, b].
  """
  users = np.asarray(users, np.int64)
  counts = offsets[users + 1] - offsets[users]
  new_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
  index = np.concatenate(
      [np.arange(offsets[u], offsets[u + 1]) for u in users]
  ) if len(users) else np.zeros([0], np.int64)
  return new_offsets, values[index.astype(np.int64)]
