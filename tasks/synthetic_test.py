import numpy as np
import pandas as pd
import pytest

from tff_fedrec.tasks import preprocessing
from tff_fedrec.tasks import synthetic


def _pairs(arrays):
  return (
      arrays.user_index.astype(np.int64) * arrays.num_items + arrays.item_index
  )


def test_frame_has_the_interaction_file_columns():
  frame = synthetic.generate_interactions(num_users=30, num_items=60)

  assert list(frame.columns) == ['user', 'item', 'rating', 'timestamp']
  assert frame['user'].map(type).eq(str).all()
  assert frame['user'].str.fullmatch(r'u\d+').all()
  assert frame['item'].str.fullmatch(r'i\d+').all()
  assert frame['rating'].dtype == np.float64
  assert frame['timestamp'].dtype == np.float64
  assert set(frame['rating']) <= {1.0, 2.0, 3.0, 4.0, 5.0}


def test_frame_and_arrays_hold_the_same_rows():
  kwargs = dict(num_users=40, num_items=80, seed=3)
  frame = synthetic.generate_interactions(**kwargs)
  arrays = synthetic.generate_interaction_arrays(**kwargs)

  assert frame['user'].tolist() == [f'u{u}' for u in arrays.user_index]
  assert frame['item'].tolist() == [f'i{i}' for i in arrays.item_index]
  np.testing.assert_array_equal(frame['timestamp'], arrays.timestamp)
  np.testing.assert_array_equal(frame['rating'], arrays.rating)


def test_deterministic_for_a_seed_and_different_across_seeds():
  first = synthetic.generate_interactions(num_users=50, num_items=100, seed=7)
  again = synthetic.generate_interactions(num_users=50, num_items=100, seed=7)
  other = synthetic.generate_interactions(num_users=50, num_items=100, seed=8)

  pd.testing.assert_frame_equal(first, again)
  assert not first.equals(other)


def test_no_duplicate_pairs_and_counts_within_bounds():
  arrays = synthetic.generate_interaction_arrays(
      num_users=500,
      num_items=60,
      mean_interactions_per_user=20,
      min_interactions_per_user=5,
  )

  pairs = _pairs(arrays)
  assert np.unique(pairs).size == pairs.size
  counts = np.bincount(arrays.user_index, minlength=500)
  assert counts.min() >= 5
  # The cap is num_items // 2 = 30, and the lognormal tail reaches it.
  assert counts.max() == 30


def test_no_duplicates_when_counts_exhaust_a_steep_popularity_curve(
    monkeypatch,
):
  # With exponent 3 almost all mass sits on a few items, so users needing
  # half the catalogue cannot finish by rejection and take the
  # Gumbel-top-k path.
  gumbel_calls = []
  gumbel_top_k = synthetic._gumbel_top_k

  def spy(*args):
    gumbel_calls.append(args)
    return gumbel_top_k(*args)

  monkeypatch.setattr(synthetic, '_gumbel_top_k', spy)
  arrays = synthetic.generate_interaction_arrays(
      num_users=100,
      num_items=40,
      mean_interactions_per_user=200,
      item_popularity_exponent=3.0,
  )

  assert gumbel_calls
  pairs = _pairs(arrays)
  assert np.unique(pairs).size == pairs.size
  counts = np.bincount(arrays.user_index, minlength=100)
  assert counts.min() >= 5 and counts.max() == 20
  # A median of 200 * exp(-1/2) ~ 121 clips most users to the cap of 20.
  assert np.mean(counts == 20) > 0.9


def test_timestamps_strictly_increase_within_each_user():
  arrays = synthetic.generate_interaction_arrays(num_users=200, num_items=100)

  same_user = np.diff(arrays.user_index) == 0
  assert (np.diff(arrays.user_index) >= 0).all()
  assert (np.diff(arrays.timestamp)[same_user] > 0).all()
  # Items come in random time order, not sorted by item index.
  assert (np.diff(arrays.item_index)[same_user] < 0).any()


def test_long_tailed_users_and_items():
  arrays = synthetic.generate_interaction_arrays(num_users=5000, num_items=2000)

  counts = np.bincount(arrays.user_index)
  assert 17 < counts.mean() < 23  # mean_interactions_per_user = 20
  assert counts.max() > 10 * np.median(counts)
  popularity = np.sort(np.bincount(arrays.item_index, minlength=2000))[::-1]
  # Zipf(1): the top 10% of items draw H(200) / H(2000) ~ 71% of an
  # unclustered sample; uniform popularity would give 10%.
  top_share = popularity[:200].sum() / popularity.sum()
  assert top_share > 0.5, top_share


def test_users_prefer_their_groups_cluster():
  arrays = synthetic.generate_interaction_arrays(num_users=2000, num_items=1000)

  in_cluster = (
      arrays.item_cluster[arrays.item_index]
      == arrays.user_group[arrays.user_index]
  )
  # 10 clusters: 10% by chance; q = 0.7 plants ~73%, less what heavy
  # users lose once they exhaust their cluster's 100 items.
  assert np.unique(arrays.item_cluster).size == 10
  assert 0.5 < in_cluster.mean() < 0.8


def test_an_item_knn_scorer_beats_popularity_and_random():
  # The planted groups must be learnable from interactions alone: an
  # item-item cosine scorer fitted on the training split ranks the
  # held-out item far better than chance (HR@10 = 10 / 100 with 99
  # negatives) and better than popularity.
  frame = synthetic.generate_interactions(num_users=400, num_items=1000)
  data = preprocessing.leave_one_out_split(
      preprocessing.index_interactions(frame), num_eval_negatives=99
  )
  train = np.zeros((data.num_users, data.num_items))
  train[
      np.repeat(np.arange(data.num_users), np.diff(data.train_offsets)),
      data.train_items,
  ] = 1.0
  popularity = train.sum(axis=0)
  cooccurrence = train.T @ train
  np.fill_diagonal(cooccurrence, 0.0)
  norm = np.sqrt(np.maximum(popularity, 1.0))
  knn_scores = train @ (cooccurrence / norm[:, None] / norm[None, :])
  candidates = np.concatenate(
      [data.test_items[:, None], data.test_negatives], axis=1
  )

  def hit_ratio_at_10(scores):
    scores = np.take_along_axis(scores, candidates, axis=1)
    ranks = 1 + np.sum(scores[:, 1:] >= scores[:, :1], axis=1)
    return np.mean(ranks <= 10)

  popularity_hr = hit_ratio_at_10(np.broadcast_to(popularity, train.shape))
  knn_hr = hit_ratio_at_10(knn_scores)
  assert knn_hr > 0.4, knn_hr
  assert knn_hr > popularity_hr + 0.1, (knn_hr, popularity_hr)


@pytest.mark.parametrize(
    'kwargs, match',
    [
        (dict(num_users=0, num_items=10), 'num_users'),
        (dict(num_users=5, num_items=8), 'min_interactions_per_user'),
        (
            dict(num_users=5, num_items=20, mean_interactions_per_user=0),
            'mean_interactions_per_user',
        ),
        (
            dict(num_users=5, num_items=20, item_popularity_exponent=-1),
            'item_popularity_exponent',
        ),
    ],
)
def test_invalid_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    synthetic.generate_interactions(**kwargs)


def test_pairs_stay_distinct_where_keys_pass_the_int32_range():
  # user * num_items + item reaches ~2.5e9 > 2^31 here, as it does at a
  # million users. How long generation takes at that size is measured by
  # programs/data_benchmark.py.
  arrays = synthetic.generate_interaction_arrays(
      num_users=50_000, num_items=50_000
  )

  pairs = _pairs(arrays)
  assert pairs.max() > np.iinfo(np.int32).max
  assert np.unique(pairs).size == pairs.size
  assert 0 <= arrays.item_index.min() and arrays.item_index.max() < 50_000
  counts = np.bincount(arrays.user_index, minlength=50_000)
  assert counts.min() >= 5
  assert 17 < counts.mean() < 23  # mean_interactions_per_user = 20
