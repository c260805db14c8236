"""Tests of the server's adaptive cluster-and-split (FedRAS Sec. 4.3)."""

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec import clustering
from tff_fedrec.algorithms.fedras import action_clustering
from tff_fedrec.algorithms.fedras import cluster_and_split

_SEED = tf.constant([2, 9], tf.int64)


def _history(*recorded):
  return cluster_and_split.SimilarityHistory(
      tf.constant(float(sum(recorded))), tf.constant(len(recorded))
  )


def _unit_circle_rows(angles_degrees, magnitudes):
  angles = np.deg2rad(angles_degrees)
  directions = np.stack([np.cos(angles), np.sin(angles)], axis=1)
  return (directions * np.asarray(magnitudes)[:, np.newaxis]).astype(
      np.float32
  )


# Four clusters of three rows in 2-D, at 0, 15, 180 and 195 degrees, each
# row 1 degree either side of its centre or on it, of magnitude 1, 1.1 or
# 1.2. The sides {0, 15} and {180, 195} are 2 apart in Euclidean distance,
# their clusters about 0.27, so k-means into C_i = 2 groups finds the
# sides; in each side the least cosine-similar pair is the outermost rows
# (16 or 17 degrees apart) and every row is nearer in angle to the one on
# its own cluster, so each split separates two clusters.
_CLUSTER = np.repeat(np.arange(4), 3)
_SIDE = _CLUSTER // 2
_ORDER = np.random.default_rng(0).permutation(12)
_ROWS = _unit_circle_rows(
    (np.array([0, 15, 180, 195]).repeat(3) + np.tile([-1, 0, 1], 4))[_ORDER],
    np.tile([1.0, 1.1, 1.2], 4)[_ORDER],
)
_CLUSTER, _SIDE = _CLUSTER[_ORDER], _SIDE[_ORDER]


def _numpy_min_average_cosine(rows, labels):
  """min over groups of AvgCosSim (Sec. 4.3), with mu = the group mean."""
  values = []
  for group in np.unique(labels[labels >= 0]):
    members = rows[labels == group].astype(np.float64)
    centre = members.mean(axis=0)
    cosines = members @ centre / (
        np.linalg.norm(members, axis=1) * np.linalg.norm(centre)
    )
    values.append(cosines.mean())
  return min(values)


def _assert_same_partition(got_labels, true_labels):
  pairs = set(zip(np.asarray(got_labels).tolist(), true_labels.tolist()))
  assert len(pairs) == len(set(np.asarray(got_labels).tolist()))
  assert len(pairs) == len(set(true_labels.tolist()))


# At 2 groups (the sides) every row is 6.5 to 8.5 degrees from its side's
# mean, min AvgCosSim ~ cos 7.5 deg = 0.991; at the 4 clusters, 0 to about
# 1 degree, ~ 0.9999. A threshold between them first holds at 4 groups.
_SIDES_SIMILARITY = _numpy_min_average_cosine(_ROWS, _SIDE)
_CLUSTERS_SIMILARITY = _numpy_min_average_cosine(_ROWS, _CLUSTER)


def test_group_bounds_by_hand():
  # C_e (1 -+ alpha), rounded half up: 203 * 0.8 = 162.4, 203 * 1.2 = 243.6;
  # 10 * 0.75 = 7.5 -> 8, 10 * 1.25 = 12.5 -> 13.
  assert cluster_and_split.group_bounds(203, 0.2) == (162, 244)
  assert cluster_and_split.group_bounds(10, 0.25) == (8, 13)
  assert cluster_and_split.group_bounds(5, 0.0) == (5, 5)
  # The smallest C_e: 0.5 -> 1 (at least 1), 1.5 -> 2.
  assert cluster_and_split.group_bounds(1, 0.5) == (1, 2)
  with pytest.raises(ValueError):
    cluster_and_split.group_bounds(5, 1.0)
  with pytest.raises(ValueError):
    cluster_and_split.group_bounds(0, 0.2)


def test_binary_split_at_the_least_similar_pair_ties_to_the_first():
  # C_e = 2, alpha = 0.5: C_i = 1 group of all five rows, split once. The
  # least similar pair is (1, 0) against (-1, 0) (cosine -1); the (0, 1)
  # rows are orthogonal to both, a tie, and join the first centre.
  rows = np.array([[1, 0], [0, 1], [-1, 0], [1, 0], [0, 1]], np.float32)

  result = cluster_and_split.cluster_and_split(
      rows, expected_groups=2, alpha=0.5,
      history=cluster_and_split.initial_similarity_history(), seed=_SEED,
  )

  np.testing.assert_array_equal(result.assignments, [0, 0, 1, 0, 0])
  np.testing.assert_array_equal(result.parents, [0, 0, 2])
  assert int(result.group_count) == 2
  # The mixed group's mean is along (1, 1), 45 degrees from each member.
  np.testing.assert_allclose(
      result.similarity_at_expected, np.sqrt(0.5), rtol=1e-6
  )
  np.testing.assert_allclose(result.history.total, np.sqrt(0.5), rtol=1e-6)
  assert int(result.history.count) == 1


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_round_zero_splits_straight_to_expected_and_recovers_clusters(seed):
  # C_e = 4, alpha = 0.5: C_i = 2, C_m = 6. No history: stop at C_e.
  result = cluster_and_split.cluster_and_split(
      _ROWS, expected_groups=4, alpha=0.5,
      history=cluster_and_split.initial_similarity_history(),
      seed=tf.constant([seed, 1], tf.int64),
  )

  assert int(result.group_count) == 4
  assert int(result.final_count) == 4
  _assert_same_partition(result.assignments, _CLUSTER)
  np.testing.assert_allclose(
      result.similarity_at_expected, _CLUSTERS_SIMILARITY, rtol=1e-6
  )
  # Labels 2 and 3 were split off the two k-means groups 0 and 1.
  parents = result.parents.numpy()
  assert sorted(parents[2:4]) == [0, 1]
  np.testing.assert_array_equal(parents[[0, 1, 4, 5]], [0, 1, 4, 5])

  actions = cluster_and_split.actions_at(_ROWS, result)
  for group in range(4):
    np.testing.assert_allclose(
        actions.centroids[group],
        _ROWS[result.assignments.numpy() == group].mean(axis=0),
        rtol=1e-6,
    )


@pytest.mark.parametrize(
    'threshold,group_count,final_count',
    [
        # Met by the sides already: stop at 2, split on to C_e = 4 only to
        # record the similarity there.
        (_SIDES_SIMILARITY - 0.001, 2, 4),
        # Between the sides and the clusters: the first stop is at 4.
        ((_SIDES_SIMILARITY + _CLUSTERS_SIMILARITY) / 2, 4, 4),
        # Above what the clusters reach: split to C_m = 6.
        (1.0, 6, 6),
    ],
)
def test_stop_at_the_learned_threshold(threshold, group_count, final_count):
  # The threshold is the mean of the earlier rounds' records.
  history = _history(threshold - 0.002, threshold + 0.002)

  result = cluster_and_split.cluster_and_split(
      _ROWS, expected_groups=4, alpha=0.5, history=history, seed=_SEED
  )

  assert int(result.group_count) == group_count
  assert int(result.final_count) == final_count
  # The record is taken at C_e = 4 groups, the clusters, in every case.
  np.testing.assert_allclose(
      result.similarity_at_expected, _CLUSTERS_SIMILARITY, rtol=1e-6
  )
  np.testing.assert_allclose(
      result.history.total, 2 * threshold + _CLUSTERS_SIMILARITY, rtol=1e-6
  )
  assert int(result.history.count) == 3
  server = cluster_and_split.actions_at(_ROWS, result)
  assert server.centroids.shape == (group_count, 2)
  expected = _SIDE if group_count == 2 else _CLUSTER
  if group_count <= 4:
    _assert_same_partition(server.assignments, expected)


def test_each_bandwidth_gets_the_groups_at_that_count():
  result = cluster_and_split.cluster_and_split(
      _ROWS, expected_groups=4, alpha=0.5,
      history=cluster_and_split.initial_similarity_history(), seed=_SEED,
  )

  at_two = cluster_and_split.actions_at(_ROWS, result, bandwidth=2)
  at_three = cluster_and_split.actions_at(_ROWS, result, tf.constant(3))
  at_ten = cluster_and_split.actions_at(_ROWS, result, bandwidth=10)

  # Two groups are the sides, k-means' C_i groups before any split.
  _assert_same_partition(at_two.assignments, _SIDE)
  # Three: one side whole, the other in its two clusters, so the groups
  # are finer than the sides and coarser than the clusters.
  labels = at_three.assignments.numpy()
  assert len(set(zip(labels.tolist(), _SIDE.tolist()))) == 3
  assert len(set(zip(labels.tolist(), _CLUSTER.tolist()))) == 4
  for actions in (at_two, at_three):
    groups = actions.assignments.numpy()
    for group in range(actions.centroids.shape[0]):
      np.testing.assert_allclose(
          actions.centroids[group],
          _ROWS[groups == group].mean(axis=0),
          rtol=1e-6,
      )
  # A bandwidth above the round's count gets the server's matrix.
  assert at_ten.centroids.shape == (4, 2)
  _assert_same_partition(at_ten.assignments, _CLUSTER)
  with pytest.raises(tf.errors.InvalidArgumentError, match='C_e'):
    cluster_and_split.actions_at(_ROWS, result, bandwidth=1)


def test_zero_and_masked_rows_are_not_clustered():
  rows = np.concatenate(
      [_ROWS, np.zeros([3, 2], np.float32), np.ones([1, 2], np.float32)]
  )
  mask = np.array([True] * 15 + [False])

  result = cluster_and_split.cluster_and_split(
      rows, expected_groups=4, alpha=0.5,
      history=cluster_and_split.initial_similarity_history(), seed=_SEED,
      row_mask=mask,
  )

  labels = result.assignments.numpy()
  np.testing.assert_array_equal(labels[12:], -1)
  _assert_same_partition(labels[:12], _CLUSTER)
  actions = cluster_and_split.actions_at(rows, result)
  decoded = action_clustering.decode_actions(
      actions.centroids, actions.assignments
  )
  np.testing.assert_array_equal(decoded[12:], 0.0)


def test_a_round_with_nothing_to_cluster_records_nothing():
  history = _history(0.9)

  result = cluster_and_split.cluster_and_split(
      np.zeros([5, 2], np.float32), expected_groups=2, alpha=0.5,
      history=history, seed=_SEED,
  )

  np.testing.assert_array_equal(result.assignments, -1)
  np.testing.assert_allclose(result.history.total, 0.9)
  assert int(result.history.count) == 1
  # No group at all counts as perfectly similar (the figure reported as
  # downlink_similarity_at_expected).
  assert float(result.similarity_at_expected) == 1.0


def test_a_group_kmeans_leaves_empty_does_not_count():
  # Five identical rows into C_i = 2 groups: k-means fills one and leaves
  # the other empty. Only the full one (AvgCosSim 1) is a group, so the
  # 0.9 threshold is met at C_i; an empty group scored as 0 would split on
  # to C_m = 6.
  rows = np.tile([[3.0, 4.0]], (5, 1)).astype(np.float32)

  result = cluster_and_split.cluster_and_split(
      rows, expected_groups=4, alpha=0.5, history=_history(0.9), seed=_SEED,
  )

  assert int(result.group_count) == 2


def test_a_similarity_equal_to_the_threshold_stops():
  # Every row along (1, 0): each group's AvgCosSim is exactly 1, as is the
  # threshold, so the count stops where it starts, C_i = 2 (a strict
  # comparison would split on to C_m = 6).
  rows = np.stack([np.arange(1.0, 13.0), np.zeros(12)], axis=1)

  result = cluster_and_split.cluster_and_split(
      rows.astype(np.float32), expected_groups=4, alpha=0.5,
      history=_history(1.0), seed=_SEED,
  )

  assert int(result.initial_count) == 2
  assert int(result.group_count) == 2


def test_alpha_zero_is_plain_kmeans_into_expected_groups():
  # C_i = C_m = C_e = 4, the FedRAS-F ablation: no split whatever tau is.
  result = cluster_and_split.cluster_and_split(
      _ROWS, expected_groups=4, alpha=0.0, history=_history(1.0), seed=_SEED
  )
  kmeans = clustering.kmeans(_ROWS, 4, _SEED)

  assert int(result.group_count) == 4
  np.testing.assert_array_equal(result.parents, np.arange(4))
  np.testing.assert_array_equal(result.assignments, kmeans.assignments)


def test_runs_in_a_tf1_graph_like_eagerly():
  graph = tf.Graph()
  with graph.as_default():
    gradient = tf.compat.v1.placeholder(tf.float32, [None, 2])
    total = tf.compat.v1.placeholder(tf.float32, [])
    count = tf.compat.v1.placeholder(tf.int32, [])
    bandwidth = tf.compat.v1.placeholder(tf.int32, [])
    result = cluster_and_split.cluster_and_split(
        gradient, expected_groups=4, alpha=0.5,
        history=cluster_and_split.SimilarityHistory(total, count),
        seed=tf.constant([2, 9], tf.int64),
    )
    actions = cluster_and_split.actions_at(gradient, result, bandwidth)
    with tf.compat.v1.Session(graph=graph) as session:
      got_result, got_actions = session.run(
          (result, actions),
          {gradient: _ROWS, total: 0.0, count: 0, bandwidth: 3},
      )

  eager = cluster_and_split.cluster_and_split(
      _ROWS, expected_groups=4, alpha=0.5,
      history=cluster_and_split.initial_similarity_history(), seed=_SEED,
  )
  eager_actions = cluster_and_split.actions_at(_ROWS, eager, bandwidth=3)
  np.testing.assert_array_equal(got_result.assignments, eager.assignments)
  assert got_result.group_count == int(eager.group_count)
  np.testing.assert_array_equal(
      got_actions.assignments, eager_actions.assignments
  )
  np.testing.assert_allclose(
      got_actions.centroids, eager_actions.centroids, rtol=1e-6
  )


def _numpy_avg_cos(rows, members):
  """AvgCosSim of one group (Sec. 4.3), float64; 0 for a group whose mean
  is 0."""
  group = rows[members]
  centre = group.mean(axis=0)
  norms = np.linalg.norm(group, axis=1) * np.linalg.norm(centre)
  if not np.linalg.norm(centre):
    return 0.0
  return float(np.mean(group @ centre / norms))


def _numpy_cluster_and_split(rows, initial_labels, expected, alpha,
                             threshold):
  """Sec. 4.3 from the paper's text, in numpy, from the initial k-means
  labels into C_i groups: split the group of least AvgCosSim at its least
  cosine-similar pair (the first of the pair in row order keeps the label;
  each member joins the centre it is more cosine-similar to, ties to the
  first); stop at the first count where every group is at least
  `threshold`-similar (None: round 0, at C_e) or at C_m; when that is below
  C_e, split on to C_e for the record. Returns (labels, parents,
  group_count, final_count, similarity at C_e)."""
  rows = rows.astype(np.float64)
  c_i = max(1, int(expected * (1 - alpha) + 0.5))
  c_m = max(expected, int(expected * (1 + alpha) + 0.5))
  labels = np.array(initial_labels)
  parents = list(range(c_m))
  unit = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True),
                           1e-30)
  count, stop, recorded = c_i, None, None

  def similarities():
    return {g: _numpy_avg_cos(rows, labels == g) for g in range(count)
            if np.any(labels == g)}

  def observe():
    nonlocal stop, recorded
    least = min(similarities().values())
    stops = count >= expected if threshold is None else least >= threshold
    if stop is None and stops:
      stop = count
    if count == expected:
      recorded = least

  observe()
  while count < c_m and not (stop is not None and count >= expected):
    values = {g: v for g, v in similarities().items()
              if np.sum(labels == g) >= 2}
    if not values:
      break
    worst = min(values, key=lambda g: (values[g], g))
    members = np.flatnonzero(labels == worst)
    cosine = unit[members] @ unit[members].T
    np.fill_diagonal(cosine, np.inf)
    first, second = np.unravel_index(np.argmin(cosine), cosine.shape)
    to_second = (unit[members] @ unit[members[second]]
                 > unit[members] @ unit[members[first]])
    to_second[first], to_second[second] = False, True
    labels[members[to_second]] = count
    parents[count] = worst
    count += 1
    observe()
  if stop is None:
    stop = count
  if count < expected:
    recorded = min(similarities().values())
  return labels, np.array(parents), stop, count, recorded


@pytest.mark.parametrize('seed', range(6))
@pytest.mark.parametrize('threshold', [None, 0.55, 0.8])
def test_cluster_and_split_matches_a_numpy_reading_of_sec_4_3(seed,
                                                             threshold):
  # Random heavy-tailed gradient rows with untrained (zero) items. Where
  # the paper's rule and a plausible other one disagree (split the largest
  # group rather than the least similar one; assign members by Euclidean
  # distance rather than cosine; start from the farthest Euclidean pair
  # rather than the least cosine-similar one), these inputs give other
  # groups, so only Sec. 4.3's rule passes.
  rng = np.random.default_rng(seed)
  rows = rng.standard_t(3, size=(60, 5)).astype(np.float32)
  rows[rng.choice(60, 6, replace=False)] = 0.0
  expected, alpha = 10, 0.4
  history = (cluster_and_split.initial_similarity_history()
             if threshold is None else _history(threshold))
  tf_seed = tf.constant([seed, 4], tf.int64)

  got = cluster_and_split.cluster_and_split(
      rows, expected_groups=expected, alpha=alpha, history=history,
      seed=tf_seed,
  )

  sent = np.any(rows != 0, axis=1)
  initial = clustering.kmeans(rows, 6, tf_seed, sent).assignments
  labels, parents, group_count, final_count, recorded = (
      _numpy_cluster_and_split(rows, initial.numpy(), expected, alpha,
                               threshold))
  np.testing.assert_array_equal(got.assignments, labels)
  np.testing.assert_array_equal(got.parents, parents)
  assert int(got.group_count) == group_count
  assert int(got.final_count) == final_count
  assert float(got.similarity_at_expected) == pytest.approx(recorded,
                                                           abs=1e-5)
  # The actions a client of each bandwidth decodes: groups above its count
  # merged back into their parents, each action the mean of its rows
  # (singletons included).
  for bandwidth in (None, 6, 8):
    count = group_count if bandwidth is None else min(bandwidth, group_count)
    merged = labels.copy()
    while (merged >= count).any():
      merged = np.where(merged >= count, parents[np.maximum(merged, 0)],
                        merged)
    means = np.stack([
        rows[merged == g].mean(axis=0) if (merged == g).any()
        else np.zeros(5) for g in range(count)
    ])
    actions = cluster_and_split.actions_at(rows, got, bandwidth)
    np.testing.assert_array_equal(actions.assignments, merged)
    np.testing.assert_allclose(actions.centroids, means, rtol=1e-5,
                               atol=1e-6)
