import collections

import numpy as np
import pytest

from tff_fedrec.algorithms import hetefedrec
from tff_fedrec.algorithms import user_groups


def _user(items, labels, seed):
  return collections.OrderedDict(
      items=np.array(items, np.int32),
      labels=np.array(labels, np.float32),
      seed=np.array(seed, np.int64),
  )


def test_group_positions_puts_users_of_similar_size_together():
  groups = user_groups.group_positions([5, 1, 9, 3, 7], users_per_group=2)
  assert [g.tolist() for g in groups] == [[1, 3], [0, 4], [2]]
  # Every position exactly once, also with one user per group.
  single = user_groups.group_positions([5, 1, 9], users_per_group=1)
  assert sorted(int(g[0]) for g in single) == [0, 1, 2]
  with pytest.raises(ValueError, match='users_per_group'):
    user_groups.group_positions([1], users_per_group=0)


def test_group_client_data_maps_each_user_to_its_compact_table():
  users = [
      _user([7, 3, 7, 9], [1, 0, 0, 1], [1, 2]),
      _user([4], [1], [3, 4]),
  ]
  data = user_groups.group_client_data(users)

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


def test_tier_group_client_data_has_the_tiered_fields_in_type_order():
  seeded = _user([7, 3], [1, 0], [5, 6])
  unseeded = collections.OrderedDict(
      items=np.array([4, 2, 2], np.int32),
      labels=np.array([1, 0, 1], np.float32),
      validation=np.array([0, 0, 1], np.float32),
  )
  data = user_groups.tier_group_client_data(
      [seeded, unseeded], tier=2, include=0.0)

  assert list(data) == list(hetefedrec.client_data_type())
  assert data['tier'] == 2 and data['include'] == 0.0
  # A user without a seed gets (0, 0); without a split, no held-out example.
  np.testing.assert_array_equal(data['seeds'], [[5, 6], [0, 0]])
  assert data['seeds'].dtype == np.int64
  np.testing.assert_array_equal(data['validation'], [[0, 0, 0], [0, 0, 1]])


def test_ungroup_states_keeps_each_users_real_rows():
  group_state = collections.OrderedDict(
      local_parameters=collections.OrderedDict(
          user_embedding=np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
      ),
      personal_item_ids=np.array([[3, 7, 9], [4, 0, 0]], np.int32),
      personal_item_rows=np.arange(12, dtype=np.float32).reshape([2, 3, 2]),
  )
  states = user_groups.ungroup_states(group_state, np.array([3, 1]))

  np.testing.assert_array_equal(
      states[1]['local_parameters']['user_embedding'], [3.0, 4.0]
  )
  np.testing.assert_array_equal(states[0]['personal_item_ids'], [3, 7, 9])
  np.testing.assert_array_equal(states[1]['personal_item_ids'], [4])
  np.testing.assert_array_equal(states[1]['personal_item_rows'], [[6.0, 7.0]])


def test_ungroup_states_without_personal_rows():
  group_state = collections.OrderedDict(
      local_parameters=collections.OrderedDict(
          user_embedding=np.zeros([2, 2], np.float32)
      ),
      personal_item_ids=np.zeros([2, 0], np.int32),
      personal_item_rows=np.zeros([2, 0, 2], np.float32),
  )
  states = user_groups.ungroup_states(group_state, np.array([3, 1]))
  assert [s['personal_item_rows'].shape for s in states] == [(0, 2), (0, 2)]
