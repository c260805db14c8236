"""A group's compact item tables (`compact_tables.group_client_data`)."""

import collections

import numpy as np

from tff_fedrec.algorithms.local_items import compact_tables


def _user(items, labels, seed):
  return collections.OrderedDict(
      items=np.array(items, np.int32),
      labels=np.array(labels, np.float32),
      seed=np.array(seed, np.int64),
  )


def test_group_client_data_maps_each_user_to_its_compact_table():
  users = [
      _user([7, 3, 7, 9], [1, 0, 0, 1], [1, 2]),
      _user([4], [1], [3, 4]),
  ]
  data = compact_tables.group_client_data(users)

  np.testing.assert_array_equal(data['num_rows'], [3, 1])
  np.testing.assert_array_equal(data['num_examples'], [4, 1])
  np.testing.assert_array_equal(data['seeds'], [[1, 2], [3, 4]])
  assert data['row_ids'].shape == (2, 3) and data['items'].shape == (2, 4)
  for index, user in enumerate(users):
    n, t = data['num_examples'][index], data['num_rows'][index]
    # Looking each example up in the compact table gives back its item.
    np.testing.assert_array_equal(
        data['row_ids'][index][data['items'][index, :n]], user['items']
    )
    np.testing.assert_array_equal(data['labels'][index, :n], user['labels'])
    assert len(set(data['row_ids'][index, :t].tolist())) == t
  # Padding is zero.
  assert data['labels'][1, 1:].tolist() == [0, 0, 0]
