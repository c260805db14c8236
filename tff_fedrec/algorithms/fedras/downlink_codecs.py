"""Server-to-client messages of FedRAS and its baselines, in TensorFlow.

After aggregating round t, the FedRAS server compresses the item update
Delta Q^(t) [N, d] (Alg. 1 line 11) into a message, and a client applies
the decoded [N, d] to its own copy of the item table (line 24,
Q_u <- Q_u + Reconstruct(Delta Q_{c_u})). The FedRAS-E ablation (Sec.
5.4.1) compresses the table Q^(t) itself, and the client replaces its copy.

A codec here has

  zero_message()             the message type's zeros (fixed shapes, so
                             rounds of messages stack into server state);
  initial_state()            the encoder's server state;
  encode(table, state, seed) -> (message, state, summary): summary is an
                             OrderedDict of scalars for the round's metrics;
  decode(message, bandwidth) -> (rows float32 [U, N, d], bytes int64 [U]):
                             what each of U clients of bandwidth e_u
                             (int32 [U], in rows) reconstructs, and the
                             bytes of the message it receives under
                             `compression.encoded_bytes` with n = N;
  message_bytes(message, bandwidth) -> bytes int64 [U]: those bytes alone,
                             without decoding (what a catch-up would cost).

  ClusteredActionsDownlink  FedRAS, Sec. 4.3: adaptive cluster-and-split.
  TopKDownlink, SvdDownlink, ColrDownlink: the baselines of Sec. 5.1.

Pure TensorFlow, graph-safe: it runs in `tff.tensorflow.computation`s.
"""

import collections

import tensorflow as tf

from tff_fedrec import clustering
from tff_fedrec.algorithms.fedras import action_clustering
from tff_fedrec.algorithms.fedras import cluster_and_split
from tff_fedrec.algorithms.fedras import compression
from tff_fedrec.algorithms.fedras import row_codecs


def _per_client(rows: tf.Tensor, bandwidth, num_bytes: int):
  """The same rows [N, d] and bytes for each of the U clients."""
  num_clients = tf.shape(bandwidth)[0]
  return (
      tf.tile(rows[tf.newaxis], [num_clients, 1, 1]),
      tf.fill([num_clients], tf.constant(num_bytes, tf.int64)),
  )


def _mean_cosine_to_actions(table, actions) -> tf.Tensor:
  """Mean over the clustered rows of cos(row, its group's action); 0 if
  no row was clustered."""
  clustered = actions.assignments >= 0
  rows = tf.boolean_mask(table, clustered)
  centres = tf.gather(
      actions.centroids, tf.boolean_mask(actions.assignments, clustered)
  )
  cosine = tf.math.divide_no_nan(
      tf.reduce_sum(rows * centres, axis=1),
      tf.norm(rows, axis=1) * tf.norm(centres, axis=1),
  )
  return tf.math.divide_no_nan(
      tf.reduce_sum(cosine), tf.cast(tf.size(cosine), tf.float32)
  )


class ClusteredActionsDownlink:
  """FedRAS's downlink: cluster-and-split with nested groups (Sec. 4.3).

  `encode` runs `cluster_and_split.cluster_and_split` on the table with the
  expected group count C_e and fluctuation factor alpha; its state is the
  similarity history behind the threshold tau. One message serves every
  bandwidth: a split keeps the earlier groups' labels, so the groups at any
  count c in [C_i, group_count] are the final labels merged back into
  their parents, and each group's action is the mean of its rows, which
  the per-label row sums and sizes give:

    assignments int32 [N]        the final label of each row (-1: zero row);
    parents     int32 [C_m]      the label each label split off from;
    initial_count, group_count, final_count int32 []  C_i, the first stop,
                                 the last split (`SplitResult`);
    label_sums  float32 [C_m, d] the sum of each label's rows;
    label_sizes float32 [C_m]    its number of rows.

  What a client receives is the server's matrix at the first stop,
  group_count, anywhere in [C_i, C_m] = C_e (1 -+ alpha) (Sec. 4.3: "the
  server will use the splitting result from the first stop"): alpha is how
  far a round's message may stray from the C_e rows its rate buys, so the
  rows sent average near C_e over rounds, more with a larger alpha (Fig.
  5b). A client's bandwidth e bounds its message the same way: it takes at
  most the C_m of e, `cluster_and_split.group_bounds(e, alpha)[1]` (C_m
  itself for e = C_e, so with one bandwidth for all, as in the paper's
  main runs, everyone gets the first stop's matrix); a client of a smaller
  bandwidth (Sec. 5.5) gets the coarser matrix at that count. A client
  decodes the groups at c = min(group_bounds(e, alpha)[1], group_count),
  exactly `cluster_and_split.actions_at(table, split, c)`; it receives the
  c actions and N group indices: 4 c d + N index_bytes(c + 1) bytes. The
  per-label sums travel in the simulation because they fold every
  bandwidth's matrix into one fixed-shape message; a client reads only its
  own matrix from them and is charged only for that. c < C_i fails (no
  such matrix was formed, as in `actions_at`), and so does C_i < 2 (at
  construction).

  Example: if group 4 split off group 1 and a client can take 4 groups
  while the round stopped at 5, the client's group 1 holds the rows of
  labels 1 and 4, and its action is their mean.

  `encode`'s summary, for the round's metrics: group_count; mean_cosine,
  the mean over clustered rows of the cosine between a row and its group's
  action in the first stop's matrix (Sec. 5.4.2 averages this over rounds:
  0.6631 on ML-100K at 93.75%); similarity_at_expected, the min
  AvgCosSim at C_e recorded for the threshold.
  """

  def __init__(self, num_items: int, dim: int, *, expected_groups: int,
               alpha: float,
               num_iterations: int = clustering.DEFAULT_LLOYD_ITERATIONS):
    self.initial_groups, self.max_groups = cluster_and_split.group_bounds(
        expected_groups, alpha
    )
    if self.initial_groups < 2:
      # clustering.kmeans fails to trace with a static k = 1: its
      # Lloyd loop's centres lose their static first dimension.
      raise ValueError(
          f'C_e (1 - alpha) = {expected_groups} (1 - {alpha}) rounds to '
          f'{self.initial_groups} group; give at least 2.'
      )
    self._num_items, self._dim = num_items, dim
    self._expected_groups, self._alpha = expected_groups, alpha
    self._num_iterations = num_iterations

  def zero_message(self):
    return collections.OrderedDict(
        assignments=tf.fill([self._num_items], -1),
        parents=tf.range(self.max_groups),
        initial_count=tf.constant(self.initial_groups),
        group_count=tf.constant(self.initial_groups),
        final_count=tf.constant(self.initial_groups),
        label_sums=tf.zeros([self.max_groups, self._dim]),
        label_sizes=tf.zeros([self.max_groups]),
    )

  def initial_state(self):
    history = cluster_and_split.initial_similarity_history()
    return collections.OrderedDict(total=history.total, count=history.count)

  def encode(self, table, state, seed):
    table = tf.convert_to_tensor(table, tf.float32)
    split = cluster_and_split.cluster_and_split(
        table,
        expected_groups=self._expected_groups,
        alpha=self._alpha,
        history=cluster_and_split.SimilarityHistory(
            state['total'], state['count']
        ),
        seed=seed,
        num_iterations=self._num_iterations,
    )
    labels = split.assignments
    message = collections.OrderedDict(
        assignments=labels,
        parents=split.parents,
        initial_count=split.initial_count,
        group_count=split.group_count,
        final_count=split.final_count,
        label_sums=tf.math.unsorted_segment_sum(
            table, labels, self.max_groups
        ),
        label_sizes=tf.math.unsorted_segment_sum(
            tf.ones([self._num_items]), labels, self.max_groups
        ),
    )
    new_state = collections.OrderedDict(
        total=split.history.total, count=split.history.count
    )
    summary = collections.OrderedDict(
        group_count=split.group_count,
        mean_cosine=_mean_cosine_to_actions(
            table, cluster_and_split.actions_at(table, split)
        ),
        similarity_at_expected=split.similarity_at_expected,
    )
    return message, new_state, summary

  def most_groups(self, bandwidth: int) -> int:
    """The most groups a client of `bandwidth` rows takes (class doc)."""
    return cluster_and_split.group_bounds(int(bandwidth), self._alpha)[1]

  def _groups_taken(self, message, bandwidth):
    """int32 [U]: how many groups each client of `bandwidth` takes."""
    # group_bounds(e, alpha)[1]: C_m of e, rounded half up, at least e; in
    # float64 as Python computes it, so that e = C_e gives exactly C_m.
    bandwidth = tf.cast(bandwidth, tf.float64)
    limit = tf.maximum(
        bandwidth, tf.floor(bandwidth * (1.0 + self._alpha) + 0.5)
    )
    return tf.minimum(tf.cast(limit, tf.int32), message['group_count'])

  def decode(self, message, bandwidth):
    bandwidth = tf.cast(bandwidth, tf.int32)
    num_clients = tf.shape(bandwidth)[0]
    count = self._groups_taken(message, bandwidth)
    enough = tf.debugging.assert_greater_equal(
        count,
        message['initial_count'],
        message='A bandwidth is below C_e (1 - alpha), the fewest groups',
    )
    with tf.control_dependencies([enough]):
      count = tf.identity(count)
    labels = tf.range(self.max_groups)
    # Unused labels have no rows; -1 drops them from the sums below.
    used = tf.where(labels < message['final_count'], labels, -1)
    group = tf.tile(used[tf.newaxis], [num_clients, 1])

    def merge_into_parent(group):
      parent = tf.gather(message['parents'], tf.maximum(group, 0))
      return (tf.where(group >= count[:, tf.newaxis], parent, group),)

    (group,) = tf.while_loop(
        lambda group: tf.reduce_any(group >= count[:, tf.newaxis]),
        merge_into_parent,
        (group,),
    )
    # Client c's groups are segments c * C_m + g.
    offset = tf.range(num_clients)[:, tf.newaxis] * self.max_groups
    segments = tf.reshape(tf.where(group >= 0, group + offset, -1), [-1])
    num_segments = num_clients * self.max_groups
    sums = tf.math.unsorted_segment_sum(
        tf.tile(message['label_sums'], [num_clients, 1]), segments,
        num_segments,
    )
    sizes = tf.math.unsorted_segment_sum(
        tf.tile(message['label_sizes'], [num_clients]), segments,
        num_segments,
    )
    actions = tf.reshape(
        sums / tf.maximum(sizes, 1.0)[:, tf.newaxis],
        [num_clients, self.max_groups, self._dim],
    )
    assignments = message['assignments']
    row_group = tf.gather(group, tf.maximum(assignments, 0), axis=1)
    row_group = tf.where(assignments[tf.newaxis] >= 0, row_group, -1)
    rows = tf.map_fn(
        lambda args: action_clustering.decode_actions(*args),
        (actions, row_group),
        fn_output_signature=tf.TensorSpec(
            [self._num_items, self._dim], tf.float32
        ),
    )
    return rows, self.message_bytes(message, bandwidth)

  def message_bytes(self, message, bandwidth):
    count = self._groups_taken(message, bandwidth)
    return row_codecs.encoded_bytes(
        'fedras', self._num_items, self._dim, count
    )


class _FixedParameterDownlink:
  """A baseline's downlink: a fixed-size message of parameter k or rank r,
  the same for every client, and no encoder state."""

  scheme = None

  def __init__(self, num_items: int, dim: int, parameter: int):
    self._num_items, self._dim, self._parameter = num_items, dim, parameter
    self._bytes = compression.encoded_bytes(
        self.scheme, num_items, dim, parameter
    )

  def initial_state(self):
    return collections.OrderedDict()

  def message_bytes(self, message, bandwidth):
    del message
    return tf.fill(
        [tf.shape(bandwidth)[0]], tf.constant(self._bytes, tf.int64)
    )


class TopKDownlink(_FixedParameterDownlink):
  """Per-row top-k of the table, values and columns [N, k] (Sec. 5.1)."""

  scheme = 'top_k'

  def zero_message(self):
    return collections.OrderedDict(
        values=tf.zeros([self._num_items, self._parameter]),
        indices=tf.zeros([self._num_items, self._parameter], tf.int32),
    )

  def encode(self, table, state, seed):
    del seed
    message = compression.top_k_encode(table, self._parameter)
    return (
        collections.OrderedDict(values=message.values, indices=message.indices),
        state,
        collections.OrderedDict(),
    )

  def decode(self, message, bandwidth):
    rows = compression.top_k_decode(
        compression.TopKMessage(message['values'], message['indices']),
        self._dim,
    )
    return _per_client(rows, bandwidth, self._bytes)


class SvdDownlink(_FixedParameterDownlink):
  """The table's rank-r truncated SVD, U_r S_r [N, r] and V_r^T [r, d]."""

  scheme = 'svd'

  def zero_message(self):
    return collections.OrderedDict(
        left=tf.zeros([self._num_items, self._parameter]),
        right=tf.zeros([self._parameter, self._dim]),
    )

  def encode(self, table, state, seed):
    del seed
    message = compression.svd_encode(table, self._parameter)
    return (
        collections.OrderedDict(left=message.left, right=message.right),
        state,
        collections.OrderedDict(),
    )

  def decode(self, message, bandwidth):
    rows = compression.low_rank_decode(
        compression.LowRankMessage(message['left'], message['right'])
    )
    return _per_client(rows, bandwidth, self._bytes)


class ColrDownlink(_FixedParameterDownlink):
  """CoLR's downlink: A [N, r] of the table on the round's factor B_r.

  B_r is the first r rows of the round's shared factor
  `colr_round_factor(seed, d)`, the factor the clients' uploads use
  (`row_codecs.Colr`): a user of upload rank r_u fits its rows onto the
  first r_u rows. `encode(table, state, seed)` fits A on B_r by least
  squares. When every upload has rank r_u <= r, the aggregate of the
  A_u B_{r_u} is a combination of B_r's rows and the downlink adds no
  error, as Table 3 notes for CoLR; the components of uploads of higher
  rank (a user whose byte budget buys more, `row_codecs.upload_budget`) are
  what it loses. The seed travels with the message, uncounted: server and
  clients agree on it, they do not send it.
  """

  scheme = 'colr'

  def _projection(self, seed):
    return compression.colr_round_factor(seed, self._dim)[
        : self._parameter
    ]

  def zero_message(self):
    return collections.OrderedDict(
        a=tf.zeros([self._num_items, self._parameter]),
        seed=tf.zeros([2], tf.int64),
    )

  def encode(self, table, state, seed):
    seed = tf.convert_to_tensor(seed, tf.int64)
    return (
        collections.OrderedDict(
            a=compression.colr_encode(
                table, self._projection(seed)
            ),
            seed=seed,
        ),
        state,
        collections.OrderedDict(),
    )

  def decode(self, message, bandwidth):
    rows = compression.colr_decode(
        message['a'], self._projection(message['seed'])
    )
    return _per_client(rows, bandwidth, self._bytes)
