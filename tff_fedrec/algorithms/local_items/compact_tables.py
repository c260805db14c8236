"""The client data of the local-item methods: each user's compact item table.

A client trains only the rows of the items in its data (PFedRec Sec. 4.3,
"Efficient on-device update"), so no client operation touches the whole
[N, d] table. A group of U users' client data (`group_client_data`; a
method adds its own fields to it):

  row_ids      int32 [U, T]  the user's compact item table: global ids of the
                              distinct items in its data (padded with 0);
  num_rows     int32 [U]     T_u, the real rows;
  items        int32 [U, N]  each example's row in the user's compact table
                              (padded with 0);
  labels       float32 [U, N];
  num_examples int32 [U]     n_u, the real examples;
  seeds        int64 [U, 2]  the user's shuffle / noise seed.

Used by every method whose clients train item rows: the local-item ones,
FedRAP and HeteFedRec's tiers.

Example:
  >>> data = group_client_data([collections.OrderedDict(
  ...     items=np.array([7, 3, 7]), labels=np.array([1., 0., 0.]),
  ...     seed=np.array([0, 1]))])
  >>> data['row_ids'], data['items']
  (array([[3, 7]], dtype=int32), array([[1, 0, 1]], dtype=int32))
"""

import collections
from collections.abc import Sequence

import numpy as np
import tensorflow_federated as tff

from tff_fedrec.templates import user_groups


def data_type() -> collections.OrderedDict:
  """The TFF types of `group_client_data`'s fields."""
  return collections.OrderedDict(
      row_ids=tff.TensorType(np.int32, [None, None]),
      num_rows=tff.TensorType(np.int32, [None]),
      items=tff.TensorType(np.int32, [None, None]),
      labels=tff.TensorType(np.float32, [None, None]),
      num_examples=tff.TensorType(np.int32, [None]),
      seeds=tff.TensorType(np.int64, [None, 2]),
  )


def group_client_data(
    user_data: Sequence[collections.OrderedDict],
) -> collections.OrderedDict:
  """One group's client data from its users' `OrderedDict(items, labels,
  seed)` (item ids global)."""
  row_ids, local_items = [], []
  for data in user_data:
    ids, inverse = np.unique(np.asarray(data['items']), return_inverse=True)
    row_ids.append(ids.astype(np.int32))
    local_items.append(inverse.astype(np.int32).reshape(-1))
  return collections.OrderedDict(
      row_ids=user_groups.pad_rows(row_ids, np.int32),
      num_rows=np.array([ids.size for ids in row_ids], np.int32),
      items=user_groups.pad_rows(local_items, np.int32),
      labels=user_groups.pad_rows(
          [np.asarray(d['labels'], np.float32) for d in user_data], np.float32
      ),
      num_examples=np.array([len(d['items']) for d in user_data], np.int32),
      seeds=np.stack([np.asarray(d['seed'], np.int64) for d in user_data]),
  )
