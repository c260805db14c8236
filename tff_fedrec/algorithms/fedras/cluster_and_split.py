"""Adaptive clustering on the server (FedRAS Sec. 4.3, Alg. 1 line 11).

After aggregating the round's item gradient Delta Q [N, d] (Sec. 4.4), the
server compresses it for the download into groups whose centroids are the
shared actions (Sec. 4.2), choosing the number of groups each round:

1. Bounds. From the expected group count C_e (set by the target
   compression rate; `compression.pick_parameter('fedras', ...)`)
   and the fluctuation factor alpha, C_i = C_e (1 - alpha) and
   C_m = C_e (1 + alpha), each rounded to the nearest integer (halves up).
   The paper's default alpha is 0.2 (Sec. 5.1); alpha = 0 gives plain
   k-means into C_e groups, the FedRAS-F ablation (Sec. 5.4.1).
2. Cluster. k-means (`clustering.kmeans`) into C_i groups.
3. Split. The group with the smallest average cosine similarity to its
   centre,
     AvgCosSim(c) = 1/|c| sum_{i in c} cos(Delta q_i, mu_c),
   is split in two: the two members with the lowest pairwise cosine become
   the centres mu_1, mu_2 (the first of the pair in row order is mu_1),
   and every member joins the centre it is more cosine-similar to, ties to
   mu_1. Each new group's action is again the mean of its members. Only
   groups of two or more rows can split.
4. Stop. At the first group count where min_c AvgCosSim(c) >= tau, or at
   C_m. The paper writes that splitting ends "when the minimum average
   cosine similarity among all groups falls below a certain threshold";
   splitting only raises similarity, so we read it as reaching tau: every
   group is at least tau-similar.
5. Threshold tau (Sec. 4.3, "Automated Calculation"). Each round records
   the min AvgCosSim when the count reaches C_e; tau for a round is the
   mean of the values recorded in all earlier rounds. Round 0 has none and
   is "directly split to C_e". When a round stops below C_e, splitting
   continues to C_e for the record, but the compressed matrix is the one
   at the first stop.

Every split keeps the earlier groups' labels and gives the new group the
next label, so the groups at any count between C_i and the final one are
recovered from the final labels and the parent of each split-off label.
That is how clients of different bandwidths (Sec. 5.5) each get a matrix:
`actions_at(gradient, split, c)` is the matrix of c groups for any c
between C_i and the first stop (`downlink_codecs.ClusteredActionsDownlink`
says which c a client of bandwidth e takes).

The splitting is a tf.while_loop whose trip count depends on the data, so
this runs in graph mode (`tff.tensorflow.computation`) as it does eagerly.
"""

import collections

import tensorflow as tf

from tff_fedrec import clustering
from tff_fedrec.algorithms.fedras import action_clustering

SimilarityHistory = collections.namedtuple(
    'SimilarityHistory', ['total', 'count']
)
SimilarityHistory.__doc__ = """The rounds' recorded similarities, Sec. 4.3.

The server state behind the threshold tau = total / count.

Fields:
  total: float32 [], the sum of the min AvgCosSim recorded at C_e groups
    in each earlier round.
  count: int32 [], how many rounds recorded one; 0 before round 0.
"""

SplitResult = collections.namedtuple(
    'SplitResult',
    [
        'assignments',
        'parents',
        'initial_count',
        'group_count',
        'final_count',
        'similarity_at_expected',
        'history',
    ],
)
SplitResult.__doc__ = """One round of cluster-and-split.

Fields:
  assignments: int32 [N], each row's group after the last split, in
    [0, final_count); -1 for a row not clustered (zero or masked).
  parents: int32 [C_m], parents[g] is the group that group g split off
    from (parents[g] < g); parents[g] = g for g < C_i and unused labels.
  initial_count: int32 [], C_i, the smallest count that can be recovered.
  group_count: int32 [], the count at the first stop: the server's
    compressed matrix has this many actions.
  final_count: int32 [], the count after the last split, >= group_count
    (larger when the round split on to C_e to record).
  similarity_at_expected: float32 [], the min AvgCosSim at C_e groups (at
    the final count if fewer rows than C_e could be split).
  history: SimilarityHistory, the input history with this round's record
    added: the state for the next round. A round with no non-zero row
    records nothing.
"""


def initial_similarity_history() -> SimilarityHistory:
  """The history before round 0: nothing recorded, so no threshold yet."""
  return SimilarityHistory(tf.constant(0.0), tf.constant(0))


def group_bounds(expected_groups: int, alpha: float) -> tuple[int, int]:
  """(C_i, C_m) = C_e (1 -+ alpha), rounded half up, at least 1 and C_e.

  Example: C_e = 203, alpha = 0.2 gives 162.4 -> 162 and 243.6 -> 244.
  """
  if not isinstance(expected_groups, int) or expected_groups < 1:
    raise ValueError(
        f'expected_groups must be an int >= 1; got {expected_groups!r}.'
    )
  if not 0.0 <= alpha < 1.0:
    raise ValueError(f'alpha must lie in [0, 1); got {alpha!r}.')
  smallest = max(1, int(expected_groups * (1.0 - alpha) + 0.5))
  largest = max(expected_groups, int(expected_groups * (1.0 + alpha) + 0.5))
  return smallest, largest


def _average_cosine(row_sum, unit_sum, size):
  """AvgCosSim of groups from their sums over members [.., d] and sizes.

  With mu = row_sum / size, sum_i cos(x_i, mu) = unit_sum . mu / ||mu||, so
  AvgCosSim = unit_sum . (row_sum / ||row_sum||) / size. A group whose rows
  cancel (row_sum = 0) has no direction and scores 0; an empty one 0.
  """
  direction = tf.math.divide_no_nan(
      row_sum, tf.norm(row_sum, axis=-1, keepdims=True)
  )
  return tf.math.divide_no_nan(
      tf.reduce_sum(unit_sum * direction, axis=-1), size
  )


def cluster_and_split(
    gradient: tf.Tensor,
    *,
    expected_groups: int,
    alpha: float,
    history: SimilarityHistory,
    seed: tf.Tensor,
    row_mask: tf.Tensor | None = None,
    num_iterations: int = clustering.DEFAULT_LLOYD_ITERATIONS,
) -> SplitResult:
  """Clusters then splits the rows of `gradient`, FedRAS Sec. 4.3.

  See the module docstring for the procedure. Rows that are zero (items no
  client trained this round) or masked out are not clustered: their index
  is -1 and they decode to zero.

  Example: rows along three directions, 2 along (1, 0), 2 along (0, 1) and
  1 along (-1, 0), with C_e = 2, alpha = 0.5 and no history: C_i = 1 group
  (all five rows), which splits at its least similar pair, (1, 0) against
  (-1, 0), into {(1, 0) x2, (0, 1) x2} and {(-1, 0)}; round 0 stops at
  C_e = 2, and records min AvgCosSim = cos 45 deg = 0.7071 (the mixed
  group's mean is along (1, 1)). Given that history, the next round stops
  at the first count where every group is at least 0.7071-similar.

  Args:
    gradient: float32 [N, d], the aggregated item gradient Delta Q.
    expected_groups: C_e >= 1, a Python int.
    alpha: the fluctuation factor in [0, 1), a Python float.
    history: SimilarityHistory of the earlier rounds.
    seed: int [2], the stateless seed of the k-means.
    row_mask: [N] bool or 0/1 of rows that may be clustered; None means all
      rows. Zero rows are left out either way.
    num_iterations: Lloyd steps of the k-means.

  Returns:
    A SplitResult; `actions_at(gradient, result)` is the compressed matrix.
  """
  initial_groups, max_groups = group_bounds(expected_groups, alpha)
  rows = tf.convert_to_tensor(gradient, tf.float32)
  sent = action_clustering.sent_rows(rows, row_mask)
  weights = tf.cast(sent, tf.float32)
  unit = tf.math.divide_no_nan(rows, tf.norm(rows, axis=1, keepdims=True))

  labels = clustering.kmeans(
      rows, initial_groups, seed, sent, num_iterations
  ).assignments
  # Per-label statistics, sized for the most groups there can be.
  sizes = tf.math.unsorted_segment_sum(weights, labels, max_groups)
  group_cosine = _average_cosine(
      tf.math.unsorted_segment_sum(rows, labels, max_groups),
      tf.math.unsorted_segment_sum(unit, labels, max_groups),
      sizes,
  )
  slots = tf.range(max_groups)
  has_history = history.count > 0
  threshold = tf.math.divide_no_nan(
      history.total, tf.cast(history.count, tf.float32)
  )

  def min_similarity(count, sizes, group_cosine):
    active = tf.logical_and(slots < count, sizes > 0)
    # No group at all (no row to cluster) counts as perfectly similar.
    return tf.reduce_min(tf.where(active, group_cosine, 1.0))

  def observe(count, sizes, group_cosine, stop_count, recorded):
    """Applies the stop rule and the C_e record at `count` groups."""
    similarity = min_similarity(count, sizes, group_cosine)
    stops = tf.where(
        has_history, similarity >= threshold, count >= expected_groups
    )
    stop_count = tf.where(
        tf.logical_and(stop_count < 0, stops), count, stop_count
    )
    recorded = tf.where(
        tf.equal(count, expected_groups), similarity, recorded
    )
    return stop_count, recorded

  def splittable(count, sizes):
    return tf.logical_and(slots < count, sizes >= 2.0)

  def keep_splitting(
      count, labels, parents, sizes, group_cosine, stop_count, recorded
  ):
    del labels, parents, group_cosine, recorded
    done = tf.logical_and(stop_count >= 0, count >= expected_groups)
    return tf.logical_and(
        tf.logical_and(count < max_groups, tf.logical_not(done)),
        tf.reduce_any(splittable(count, sizes)),
    )

  def split_worst(
      count, labels, parents, sizes, group_cosine, stop_count, recorded
  ):
    worst = tf.argmin(
        tf.where(splittable(count, sizes), group_cosine, float('inf')),
        output_type=tf.int32,
    )
    members = tf.where(tf.equal(labels, worst))[:, 0]
    member_units = tf.gather(unit, members)
    size = tf.shape(members)[0]
    pairwise = tf.linalg.set_diag(
        tf.matmul(member_units, member_units, transpose_b=True),
        tf.fill([size], float('inf')),
    )
    least_similar = tf.argmin(tf.reshape(pairwise, [-1]), output_type=tf.int32)
    # The pair in row order: float32 matmul need not be exactly symmetric
    # (the CPU's kernels sum (i, j) and (j, i) in other orders), so the
    # least entry may sit below the diagonal.
    row, column = least_similar // size, least_similar % size
    first, second = tf.minimum(row, column), tf.maximum(row, column)
    to_second = tf.linalg.matvec(
        member_units, member_units[second]
    ) > tf.linalg.matvec(member_units, member_units[first])
    position = tf.range(size)
    # The two centres stay in their own groups even if their cosine is 1.
    to_second = tf.logical_and(
        tf.logical_or(to_second, tf.equal(position, second)),
        tf.not_equal(position, first),
    )
    labels = tf.tensor_scatter_nd_update(
        labels,
        tf.boolean_mask(members, to_second)[:, tf.newaxis],
        tf.fill([tf.reduce_sum(tf.cast(to_second, tf.int32))], count),
    )
    halves = tf.cast(to_second, tf.int32)
    member_rows = tf.gather(rows, members)
    half_sizes = tf.math.unsorted_segment_sum(tf.ones([size]), halves, 2)
    half_cosine = _average_cosine(
        tf.math.unsorted_segment_sum(member_rows, halves, 2),
        tf.math.unsorted_segment_sum(member_units, halves, 2),
        half_sizes,
    )
    updated = tf.stack([worst, count])[:, tf.newaxis]
    sizes = tf.tensor_scatter_nd_update(sizes, updated, half_sizes)
    group_cosine = tf.tensor_scatter_nd_update(
        group_cosine, updated, half_cosine
    )
    parents = tf.tensor_scatter_nd_update(parents, [[count]], [worst])
    count += 1
    stop_count, recorded = observe(
        count, sizes, group_cosine, stop_count, recorded
    )
    return count, labels, parents, sizes, group_cosine, stop_count, recorded

  count = tf.constant(initial_groups)
  stop_count, recorded = observe(
      count, sizes, group_cosine, tf.constant(-1), tf.constant(0.0)
  )
  count, labels, parents, sizes, group_cosine, stop_count, recorded = (
      tf.while_loop(
          keep_splitting,
          split_worst,
          (count, labels, slots, sizes, group_cosine, stop_count, recorded),
      )
  )
  # Reached C_m, or ran out of groups to split, without meeting tau.
  stop_count = tf.where(stop_count < 0, count, stop_count)
  recorded = tf.where(
      count < expected_groups,
      min_similarity(count, sizes, group_cosine),
      recorded,
  )
  recorded_rounds = tf.cast(tf.reduce_any(sent), tf.int32)
  return SplitResult(
      assignments=labels,
      parents=parents,
      initial_count=tf.constant(initial_groups),
      group_count=stop_count,
      final_count=count,
      similarity_at_expected=recorded,
      history=SimilarityHistory(
          history.total + recorded * tf.cast(recorded_rounds, tf.float32),
          history.count + recorded_rounds,
      ),
  )


def actions_at(
    gradient: tf.Tensor, split: SplitResult, bandwidth=None
) -> clustering.KMeansResult:
  """The compressed matrix of at most `bandwidth` groups, Sec. 4.3/5.5
  (how many a client takes: `downlink_codecs.ClusteredActionsDownlink`).

  The groups at min(bandwidth, split.group_count): labels split off after
  that count are mapped back to their parents, and each group's action is
  the mean of its rows. `action_clustering.decode_actions(centroids,
  assignments)` is the update the client applies.

  Example: if the round stopped at 5 groups and group 4 split off group 1,
  a client of bandwidth 4 gets group 4's rows back in group 1.

  Args:
    gradient: float32 [N, d], the gradient `split` was computed from.
    split: the round's SplitResult.
    bandwidth: e >= split.initial_count, an int or int32 scalar tensor;
      None is the server's own matrix, at split.group_count. A smaller
      bandwidth fails: no count below C_i was ever formed, so choose alpha
      with C_e (1 - alpha) at most the smallest bandwidth, as Sec. 5.5
      does.

  Returns:
    KMeansResult(centroids float32 [c, d], assignments int32 [N]) with
    c = min(bandwidth, group_count).
  """
  rows = tf.convert_to_tensor(gradient, tf.float32)
  count = split.group_count
  if bandwidth is not None:
    count = tf.minimum(tf.convert_to_tensor(bandwidth, tf.int32), count)
  enough = tf.debugging.assert_greater_equal(
      count,
      split.initial_count,
      message='The bandwidth is below C_e (1 - alpha), the fewest groups',
  )
  with tf.control_dependencies([enough]):
    count = tf.identity(count)

  def merge_into_parent(labels):
    # gather needs a valid index also where tf.where keeps the label.
    parent = tf.gather(split.parents, tf.maximum(labels, 0))
    return (tf.where(labels >= count, parent, labels),)

  (labels,) = tf.while_loop(
      lambda labels: tf.reduce_any(labels >= count),
      merge_into_parent,
      (split.assignments,),
  )
  sums = tf.math.unsorted_segment_sum(rows, labels, count)
  sizes = tf.math.unsorted_segment_sum(
      tf.cast(labels >= 0, tf.float32), labels, count
  )
  return clustering.KMeansResult(
      sums / tf.maximum(sizes, 1.0)[:, tf.newaxis], labels
  )
