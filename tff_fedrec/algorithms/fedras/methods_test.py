"""Tests of FedRAS and its baselines against rounds written out by hand.

The reference (`_reference_rounds`) is Algorithm 1 one user at a time in
numpy, built from the pure-TF pieces the paper's steps name
(`local_sgd.train_locally`, `action_clustering`, `cluster_and_split`,
`compression`), none of the process's own codecs. It trains on
the user's whole table copy, where the process trains a compact table of
the user's items: the same SGD, since only a batch's rows move.

All computations run on one TFF worker owned by this module
(`execution.worker_execution_context`), stopped when the module is done.
"""

import collections
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec import models
from tff_fedrec.algorithms import method as method_lib
from tff_fedrec.algorithms.fedras import action_clustering
from tff_fedrec.algorithms.fedras import bandwidths as fedras_bandwidths
from tff_fedrec.algorithms.fedras import cluster_and_split
from tff_fedrec.algorithms.fedras import compressed_exchange
from tff_fedrec.algorithms.fedras import compression
from tff_fedrec.algorithms.fedras import exchange as fedras_exchange
from tff_fedrec.algorithms.fedras import methods as fedras
from tff_fedrec.algorithms.local_items import client_training
from tff_fedrec.algorithms.local_items import exchanges
from tff_fedrec.algorithms.local_items import item_scoring
from tff_fedrec.algorithms.local_items import local_sgd
from tff_fedrec.programs import execution

_NUM_ITEMS = 24
_DIM = 4
_NUM_USERS = 5
_EXAMPLES = 8  # Per user and round: one traced shape for the reference.
_TRAINING = client_training.ClientTrainingConfig(
    learning_rate=0.5,
    item_learning_rate=2.0,
    batch_size=4,
    local_epochs=2,
    dual_personalization=False,
)
# N = 24, d = 4: dense 384 bytes. At CR 0.78 FedRAS gets C_e = 4 actions
# (4 * 4 * 4 + 24 = 88 bytes, CR 0.771); users train 4-8 items, so most
# cluster.
_RATE = 0.78
_SCHEDULE = ([0, 1, 2], [1, 3, 4])


def _run_data(num_users=_NUM_USERS, num_items=_NUM_ITEMS, user_tiers=None):
  return method_lib.RunData(
      num_users, num_items, np.zeros([num_users + 1], np.int64),
      np.zeros([0], np.int32), user_tiers,
  )


# Arguments of FedRAS's exchange options; the others go to the builder.
_EXCHANGE_OPTIONS = ('compression_rate', 'alpha', 'compression_rate_range',
                     'tier_compression_rates', 'catch_up_rounds',
                     'resync_when_cheaper')


def _fedras(num_items=_NUM_ITEMS, data=None, **kwargs):
  options = {k: kwargs.pop(k) for k in _EXCHANGE_OPTIONS if k in kwargs}
  kwargs.setdefault('embedding_dim', _DIM)
  kwargs.setdefault('training', _TRAINING)
  return fedras.build_fedras(
      data=data or _run_data(num_items=num_items),
      exchange=fedras_exchange.FedRASOptions(**options), **kwargs,
  )


def _baseline(scheme, **kwargs):
  return fedras.build_codec_baseline(
      scheme, data=_run_data(), embedding_dim=_DIM, training=_TRAINING,
      exchange=fedras_exchange.CodecBaselineOptions(
          scheme, compression_rate=_RATE),
      **kwargs,
  )


def _with_bandwidths(method, bandwidth):
  """`method` whose users have the bandwidths of the dict `bandwidth`
  (e.g. by tier); the process does not depend on them."""
  lookup = lambda users: np.array([bandwidth[u] for u in users], np.int32)
  return dataclasses.replace(
      method, exchange=dataclasses.replace(method.exchange, bandwidths=lookup)
  )


def _round(method, state, store, users, data, round_num=0):
  return method.run_round(
      state, store,
      method_lib.RoundInput(round_num, np.array(users), data, None, 0),
      users_per_client=2,
  )


@pytest.fixture(scope='module', autouse=True)
def tff_worker():
  with execution.worker_execution_context() as pid:
    yield pid


def _upload_parameter(scheme, num_rows, dim, bandwidth):
  """A baseline's k or rank for an upload of num_rows rows: the largest
  whose bytes fit what FedRAS would send (min(T_u, e_u) actions), by search
  over every parameter; 1 if none fits."""
  budget = compression.encoded_bytes(
      'fedras', num_rows, dim, min(num_rows, bandwidth)
  )
  largest = min(num_rows, dim) if scheme == 'svd' else dim
  return max(
      [1] + [
          p for p in range(1, largest + 1)
          if compression.encoded_bytes(scheme, num_rows, dim, p)
          <= budget
      ]
  )


def _client_data(users, round_num):
  rng = np.random.default_rng([1, round_num, *users])
  data = []
  for user in users:
    items = rng.choice(_NUM_ITEMS, size=_EXAMPLES)
    data.append(
        collections.OrderedDict(
            items=items.astype(np.int32),
            labels=rng.integers(0, 2, _EXAMPLES).astype(np.float32),
            seed=np.array([round_num, user], np.int64),
        )
    )
  return data


def _assert_not_on_a_knife_edge(rows, bandwidth, seed, action_index):
  """The process trains users in groups, padded, in TFF; the reference one
  by one: their rows agree to float rounding, not bit for bit, and k-means
  (a discontinuous function of its rows) agrees only where rows that move
  by a millionth keep their actions. Data where they do not (seen on one
  CPU and not on another) would fail the comparison for no fault of the
  process: say so, rather than print a mismatch of item rows."""
  noise = np.random.default_rng(0).standard_normal(rows.shape)
  nudged = action_clustering.encode_actions(
      (rows * (1 + 1e-6 * noise)).astype(np.float32), bandwidth, seed)
  np.testing.assert_array_equal(
      nudged.action_index, action_index,
      err_msg='The test data put a client\'s k-means on a knife edge; '
              'change the seed of _client_data.')


class _Reference:
  """Algorithm 1 by hand for one configuration (module docstring)."""

  def __init__(self, method, *, scheme, downlink_parameter=None, alpha=0.2,
               normalization='participation', embeddings=False,
               catch_up_rounds=fedras_exchange.DEFAULT_CATCH_UP_ROUNDS,
               resync_when_cheaper=False):
    self.spec = method.spec
    self.resync_when_cheaper = resync_when_cheaper
    params = tf.nest.map_structure(np.copy, method.initial_parameters)
    self.table = params['item_embedding']
    self.theta = collections.OrderedDict(
        (k, params[k]) for k in self.spec.global_keys if k != 'item_embedding'
    )
    self.user_embedding = {
        u: params['user_embedding'].copy() for u in range(_NUM_USERS)
    }
    self.copy = {u: self.table.copy() for u in range(_NUM_USERS)}
    self.synced = {u: 0 for u in range(_NUM_USERS)}
    self.scheme, self.alpha = scheme, alpha
    self.expected_groups = method.exchange.bandwidths.expected_groups
    self.downlink_parameter = downlink_parameter
    self.upload_parameters = []
    self.normalization, self.embeddings = normalization, embeddings
    self.history = catch_up_rounds
    self.similarity = cluster_and_split.initial_similarity_history()
    self.messages = {}
    self.tables = [self.table]
    self.clustered_uploads = 0
    self.group_counts = []

  def _round_seed(self, round_num):
    return np.array([0, round_num], np.int64)

  def _colr_factor(self, rank, round_num):
    """The first `rank` rows of the round's CoLR factor B [d, d]."""
    return compression.colr_projection(
        self._round_seed(round_num), _DIM, _DIM
    )[:rank]

  def _gradient_map(self, num_rows, bandwidth, round_num):
    """CoLR trains A through the loss: its item gradients move in the row
    space of the first r_u rows of the round's B; None for the others."""
    if self.scheme != 'colr':
      return None
    rank = _upload_parameter('colr', num_rows, _DIM, bandwidth)
    return compression.colr_gradient_map(
        self._colr_factor(rank, round_num)
    )

  def _upload(self, rows, bandwidth, seed, round_num):
    """Decoded rows and bytes of one user's message."""
    n, d = rows.shape
    if self.scheme == 'fedras':
      kmeans_seed = compressed_exchange.kmeans_seeds(seed[None])[0]
      message = action_clustering.encode_actions(rows, bandwidth, kmeans_seed)
      _assert_not_on_a_knife_edge(rows, bandwidth, kmeans_seed,
                                  message.action_index)
      decoded = action_clustering.decode_actions(
          message.actions, message.action_index
      )
      self.clustered_uploads += int(message.compressed)
      sent = compression.encoded_bytes(
          'fedras', n, d, int(message.actions.shape[0])
      )
    else:
      parameter = _upload_parameter(self.scheme, n, d, bandwidth)
      self.upload_parameters.append(parameter)
      sent = compression.encoded_bytes(self.scheme, n, d, parameter)
      if self.scheme == 'top_k':
        decoded = compression.top_k_decode(
            compression.top_k_encode(rows, parameter), d
        )
      elif self.scheme == 'svd':
        decoded = compression.low_rank_decode(
            compression.svd_encode(rows, parameter)
        )
      else:
        projection = self._colr_factor(parameter, round_num)
        decoded = compression.colr_decode(
            compression.colr_encode(rows, projection), projection
        )
        # Trained through the loss, the update lies in B_r's row space.
        np.testing.assert_allclose(decoded, rows, atol=1e-4)
    return np.asarray(decoded), sent

  def _download_message(self, payload, round_num):
    """A function bandwidth -> (decoded [N, d], bytes) for this round."""
    n, d = payload.shape
    if self.scheme == 'fedras':
      split = cluster_and_split.cluster_and_split(
          payload, expected_groups=self.expected_groups, alpha=self.alpha,
          history=self.similarity, seed=self._round_seed(round_num),
      )
      self.similarity = split.history
      self.group_counts.append(int(split.group_count))

      def decode(bandwidth):
        # Sec. 4.3: the first stop's groups, at most C_m of the bandwidth.
        most = max(int(bandwidth),
                   int(np.floor(bandwidth * (1 + self.alpha) + 0.5)))
        groups = min(most, int(split.group_count))
        actions = cluster_and_split.actions_at(payload, split, groups)
        return (
            np.asarray(action_clustering.decode_actions(*actions)),
            compression.encoded_bytes('fedras', n, d, groups),
        )

      return decode
    if self.scheme == 'top_k':
      rows = compression.top_k_decode(
          compression.top_k_encode(payload, self.downlink_parameter),
          d,
      )
    elif self.scheme == 'svd':
      rows = compression.low_rank_decode(
          compression.svd_encode(payload, self.downlink_parameter)
      )
    else:
      projection = compression.colr_projection(
          self._round_seed(round_num), self.downlink_parameter, d
      )
      rows = compression.colr_decode(
          compression.colr_encode(payload, projection), projection
      )
    sent = compression.encoded_bytes(
        self.scheme, n, d, self.downlink_parameter
    )
    return lambda bandwidth: (np.asarray(rows), sent)

  def _catch_up(self, user, round_num, bandwidth):
    """Alg. 1 line 24 for every round the user missed; returns bytes."""
    start = self.synced[user]
    if self.embeddings:
      if start < round_num:
        rows, sent = self.messages[round_num - 1](bandwidth)
        self.copy[user] = rows
        self.message_bytes += sent
        self.messages_applied += 1
        return sent
      return 0
    dense = compression.dense_bytes(*self.table.shape)
    if round_num - start > self.history:
      self.copy[user] = self.table.copy()
      self.resynced.append(user)
      return dense
    missed = [self.messages[r](bandwidth) for r in range(start, round_num)]
    sent = sum(message_bytes for _, message_bytes in missed)
    if self.resync_when_cheaper and sent > dense:
      self.copy[user] = self.table.copy()
      self.resynced.append(user)
      return dense
    for rows, _ in missed:
      self.copy[user] = self.copy[user] + rows
    self.message_bytes += sent
    self.messages_applied += len(missed)
    return sent

  def round(self, round_num, users, data, bandwidths):
    """One round; returns (train loss, upload bytes, download bytes)."""
    update_sum = np.zeros_like(self.table)
    participants = np.zeros([self.table.shape[0]])
    theta_deltas, loss_sum, count, uploaded, downloaded = [], 0.0, 0, 0, 0
    self.message_bytes, self.messages_applied = 0, 0
    self.resynced = []
    for user, user_data, bandwidth in zip(users, data, bandwidths):
      downloaded += self._catch_up(user, round_num, bandwidth)
      copy = self.copy[user]
      global_part = collections.OrderedDict(item_embedding=copy)
      global_part.update(self.theta)
      ids = np.unique(user_data['items'])
      result = local_sgd.train_locally(
          self.spec,
          models.merge_parameters(
              self.spec, global_part,
              collections.OrderedDict(user_embedding=self.user_embedding[user]),
          ),
          tf.constant(user_data['items']),
          tf.constant(user_data['labels']),
          batch_size=_TRAINING.batch_size,
          local_epochs=_TRAINING.local_epochs,
          learning_rate=_TRAINING.learning_rate,
          item_learning_rate=_TRAINING.item_learning_rate,
          alternating=False,
          shuffle_seed=tf.constant(user_data['seed']),
          item_gradient_map=self._gradient_map(len(ids), bandwidth, round_num),
      )
      trained = tf.nest.map_structure(np.asarray, result.parameters)
      rows = trained['item_embedding'][ids]
      if not self.embeddings:
        rows = rows - copy[ids]
      decoded, sent = self._upload(
          rows, bandwidth, user_data['seed'], round_num
      )
      update_sum[ids] += decoded
      participants[ids] += 1
      uploaded += sent
      theta_deltas.append(
          tf.nest.map_structure(
              np.subtract, collections.OrderedDict(
                  (k, trained[k]) for k in self.theta
              ), self.theta,
          )
      )
      self.user_embedding[user] = trained['user_embedding']
      self.synced[user] = round_num
      loss_sum += float(result.loss_sum)
      count += int(result.num_examples)
    if self.normalization == 'participation':
      with np.errstate(invalid='ignore', divide='ignore'):
        update = np.where(
            participants[:, None] > 0, update_sum / participants[:, None], 0.0
        )
    else:
      update = update_sum / len(users)
    if self.embeddings:
      self.table = np.where(participants[:, None] > 0, update, self.table)
      payload = self.table
    else:
      self.table = self.table + update
      payload = update
    self.table = self.table.astype(np.float32)
    self.tables.append(self.table)
    if self.theta:
      mean_delta = tf.nest.map_structure(
          lambda *d: np.mean(np.stack(d), axis=0), *theta_deltas
      )
      self.theta = tf.nest.map_structure(np.add, self.theta, mean_delta)
    self.messages[round_num] = self._download_message(
        payload.astype(np.float32), round_num
    )
    return loss_sum / count, uploaded, downloaded


def _close(got, expected):
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def _run_and_compare(method, reference, schedule=_SCHEDULE, bandwidth=None):
  """Runs the schedule's rounds through `method.run_round` and checks every
  round's state, loss and bytes against the reference; `bandwidth` (a dict
  by user) replaces the method's e_u."""
  if bandwidth is not None:
    method = _with_bandwidths(method, bandwidth)
  store = method.initial_store()
  state = method.process.initialize()
  theta_bytes = exchanges.dense_parameter_bytes(
      method.spec, method.initial_parameters
  )
  for round_num, users in enumerate(schedule):
    data = _client_data(users, round_num)
    bandwidths = [int(e) for e in method.exchange.bandwidths(users)]
    result = _round(method, state, store, users, data, round_num)
    state = result.server_state
    sent = result.metrics
    loss, uploaded, downloaded = reference.round(
        round_num, users, data, bandwidths
    )

    global_params = method.global_parameters(state)
    _close(global_params['item_embedding'], reference.table)
    for key in reference.theta:
      tf.nest.map_structure(_close, global_params[key], reference.theta[key])
    for user in users:
      local = store.local_parameters([user])[0]
      _close(local['user_embedding'], reference.user_embedding[user])
      _close(local['item_copy'], reference.copy[user])
      assert local['synced_round'] == round_num
    np.testing.assert_allclose(sent['train_loss'], loss, rtol=1e-5)
    assert sent['upload_bytes'] == uploaded + len(users) * theta_bytes
    assert sent['download_bytes'] == downloaded + len(users) * theta_bytes
    # Per message: the messages applied, without resyncs or theta.
    assert sent['message_download_bytes'] == reference.message_bytes
    assert sent['dense_message_download_bytes'] == (
        reference.messages_applied
        * compression.dense_bytes(*reference.table.shape)
    )
    assert int(state['round_num']) == round_num + 1
    if reference.group_counts:
      # The round's metrics carry the message's group count.
      assert sent['downlink_group_count'] == reference.group_counts[-1]
  return state, store


@pytest.mark.parametrize('model', ['mf', 'ncf'])
def test_fedras_rounds_match_the_reference(model):
  method = _fedras(
      compression_rate=_RATE, model=model,
      hidden_units=(3,) if model == 'ncf' else (),
  )
  assert method.exchange.bandwidths.expected_groups == 4
  reference = _Reference(method, scheme='fedras')
  state, store = _run_and_compare(method, reference)
  # Round 1's message was cut at the threshold of round 0's record.
  assert int(state['distributor']['encoder']['count']) == 2
  assert reference.clustered_uploads >= 3
  # User 3 started round 1 from Q^(0) plus round 0's clustered actions:
  # near the server's Q^(1), not on it.
  start, server = reference.tables[0], reference.tables[1]
  copy = store.local_parameters([3])[0]['item_copy']
  error = np.abs(copy - server).sum()
  assert 0 < error < 0.5 * np.abs(start - server).sum()


@pytest.mark.parametrize(
    'ablation,options',
    [
        ('E', dict(embeddings=True)),
        ('F', dict(alpha=0.0)),
        ('T', dict(normalization='clients')),
    ],
)
def test_ablations_match_the_reference(ablation, options):
  method = _fedras(compression_rate=_RATE, ablation=ablation)
  _run_and_compare(method, _Reference(method, scheme='fedras', **options))


@pytest.mark.parametrize('scheme', ['top_k', 'svd', 'colr'])
@pytest.mark.parametrize(
    'bandwidth', [None, {0: 2, 1: 8, 2: 4, 3: 8, 4: 3}],
    ids=['homogeneous', 'per_user'],
)
def test_baselines_match_the_reference(scheme, bandwidth):
  method = _baseline(scheme)
  downlink_parameter = compression.pick_parameter(
      scheme, _NUM_ITEMS, _DIM, _RATE
  )
  # The download: k = 1 of 4 columns (CR 0.6875), rank 1 (svd 0.7083, colr
  # 0.75) for the [24, 4] table.
  assert downlink_parameter == 1
  reference = _Reference(
      method, scheme=scheme, downlink_parameter=downlink_parameter,
      normalization='clients',
  )
  _run_and_compare(method, reference, bandwidth=bandwidth)
  # The uploads follow each user's budget. At e_u = C_e = 4, T_u = 7 rows
  # have B_u = 4 * 4 * 4 + 7 = 71 bytes: top-k k_u = 71 // 35 = 2, svd
  # r_u = 71 // 44 = 1, colr r_u = 71 // 28 = 2; at e_u = 8, B_u =
  # 4 * 7 * 4 + 7 = 119: k_u = 3, r_u = 2 and 4.
  if bandwidth is None and scheme != 'svd':
    assert max(reference.upload_parameters) > downlink_parameter
  if bandwidth is not None:
    assert len(set(reference.upload_parameters)) > 1


def test_baseline_uploads_take_about_fedras_bytes():
  """Same users, same round: each baseline's upload fits FedRAS's."""
  users = _SCHEDULE[0]
  data = _client_data(users, 0)
  sent = {}
  for scheme in ('fedras', 'top_k', 'svd', 'colr'):
    if scheme == 'fedras':
      method = _fedras(compression_rate=_RATE)
    else:
      method = _baseline(scheme)
    store = method.initial_store()
    result = _round(method, method.process.initialize(), store, users, data)
    sent[scheme] = result.metrics['upload_bytes']
  # MF has no theta: the bytes are the item messages. FedRAS sends B_u =
  # 4 min(T_u, 4) 4 + T_u (one-byte indices) for each user, its trained
  # rows all changed; every baseline at most that, and more than half.
  budget = sum(
      compression.encoded_bytes('fedras', n, _DIM, min(n, 4))
      for n in (len(np.unique(d['items'])) for d in data)
  )
  assert sent['fedras'] == budget
  for scheme in ('top_k', 'svd', 'colr'):
    assert budget / 2 < sent[scheme] <= budget, (scheme, sent)


def test_clients_away_longer_than_the_kept_rounds_download_the_table():
  method = _fedras(compression_rate=_RATE, catch_up_rounds=1)
  reference = _Reference(method, scheme='fedras', catch_up_rounds=1)
  # Round 2: user 0 (last in round 0) and user 4 (never) missed round 1's
  # message: dense download; user 3 only needs round 1's.
  state, store = _run_and_compare(
      method, reference, schedule=([0, 1, 2], [1, 3], [0, 3, 4])
  )
  table = method.global_parameters(state)['item_embedding']
  # Their copies started round 2 as the round-2 server table; user 3's did
  # not (compression error), and nobody keeps the trained rows.
  copies = store.local_parameters([0, 3, 4])
  assert not np.allclose(copies[0]['item_copy'], table)
  np.testing.assert_array_equal(copies[0]['item_copy'], copies[2]['item_copy'])
  assert not np.allclose(copies[1]['item_copy'], copies[0]['item_copy'])


@pytest.mark.parametrize('resync_when_cheaper', [True, False])
def test_clients_whose_missed_messages_cost_more_download_the_table(
    resync_when_cheaper
):
  method = _fedras(
      compression_rate=_RATE, resync_when_cheaper=resync_when_cheaper
  )
  reference = _Reference(
      method, scheme='fedras', resync_when_cheaper=resync_when_cheaper
  )
  # A message of 4 or 5 actions costs 4 x 4 c + 24 = 88 or 104 bytes, the
  # table 4 x 24 x 4 = 384. Round 6: user 0 missed rounds 4 and 5 (at
  # most 208 bytes) and applies them; user 4 missed rounds 1-5 (at least
  # 440 bytes), well within H = 32 rounds, and downloads the table, or
  # (without resync_when_cheaper) applies the five messages.
  _, store = _run_and_compare(
      method, reference,
      schedule=([0, 4], [1], [2], [0, 1], [2], [3], [0, 4]),
  )
  assert method.exchange.bandwidths.expected_groups == 4
  assert reference.history == fedras_exchange.DEFAULT_CATCH_UP_ROUNDS
  assert reference.resynced == ([4] if resync_when_cheaper else [])
  copies = store.local_parameters([0, 4])
  # Applying every message, both copies hold messages 0-5 at the same
  # bandwidth; user 4's resync gave it the server's table instead.
  same = np.allclose(copies[0]['item_copy'], copies[1]['item_copy'])
  assert same == (not resync_when_cheaper)


def test_heterogeneous_bandwidths_match_the_reference():
  method = _fedras(compression_rate=_RATE, alpha=0.5)
  # C_e = 4, alpha = 0.5: C_i = 2, so bandwidths 2 to 6 are served; given
  # per user (e.g. by tier).
  bandwidth = {0: 2, 1: 6, 2: 3, 3: 2, 4: 5}
  reference = _Reference(method, scheme='fedras', alpha=0.5)
  _, store = _run_and_compare(method, reference, bandwidth=bandwidth)
  # Users 3 and 4 caught up on the same message at bandwidths 2 and 5.
  copies = store.local_parameters([3, 4])
  assert not np.allclose(copies[0]['item_copy'], copies[1]['item_copy'])


def test_client_bandwidths_from_a_rate_range_are_fixed_per_user():
  bandwidths = fedras_bandwidths.ClientBandwidths(
      1682, 32, 0.5, compression_rate_range=(0.7, 0.9), seed=3
  )
  drawn = bandwidths(np.arange(200))
  again = fedras_bandwidths.ClientBandwidths(
      1682, 32, 0.5, compression_rate_range=(0.7, 0.9), seed=3
  )(np.arange(200)[::-1])[::-1]

  np.testing.assert_array_equal(drawn, again)
  lowest = compression.pick_parameter('fedras', 1682, 32, 0.9)
  highest = compression.pick_parameter('fedras', 1682, 32, 0.7)
  assert lowest <= drawn.min() and drawn.max() <= highest
  assert len(np.unique(drawn)) > 20
  assert bandwidths.smallest == lowest
  assert bandwidths.expected_groups == compression.pick_parameter(
      'fedras', 1682, 32, 0.8
  )
  # Homogeneous: e_u = C_e (ML-100K at 93.75%: 4 * 92 * 32 + 1682 bytes).
  homogeneous = fedras_bandwidths.ClientBandwidths(1682, 32, 0.9375)
  assert homogeneous.expected_groups == 92
  np.testing.assert_array_equal(homogeneous([4, 9]), [92, 92])


def test_client_bandwidths_given_per_user_follow_each_users_rate():
  # Users 0-4 low-end (97%), 5-7 mid (90%), 8-9 high-end (50%).
  rates = (0.97,) * 5 + (0.9,) * 3 + (0.5,) * 2
  bandwidths = fedras_bandwidths.ClientBandwidths(1682, 32, 0.9375, user_rates=rates)
  pick = lambda rate: compression.pick_parameter(
      'fedras', 1682, 32, rate
  )

  np.testing.assert_array_equal(
      bandwidths([9, 0, 6, 4, 8]),
      [pick(0.5), pick(0.97), pick(0.9), pick(0.97), pick(0.5)],
  )
  assert pick(0.97) < pick(0.9) < pick(0.5)
  # C_e from the median rate (0.935, the mean of the middle two, 0.9 and
  # 0.97), not from compression_rate; the smallest bandwidth from the
  # highest rate.
  assert bandwidths.expected_groups == pick(0.935)
  assert bandwidths.smallest == pick(0.97)
  with pytest.raises(ValueError, match='user ids'):
    bandwidths([10])
  with pytest.raises(ValueError, match='not both'):
    fedras_bandwidths.ClientBandwidths(
        1682, 32, 0.9, compression_rate_range=(0.5, 0.9), user_rates=rates
    )
  with pytest.raises(ValueError, match=r'\[0, 1\)'):
    fedras_bandwidths.ClientBandwidths(1682, 32, 0.9, user_rates=(0.5, 1.0))


def test_build_fedras_takes_rates_per_tier():
  # Six small-tier users at 95%, six large-tier ones at 60%.
  data = _run_data(12, 1682, user_tiers=np.array([0] * 6 + [2] * 6))
  method = _fedras(data=data, embedding_dim=32,
                   tier_compression_rates=(0.95, 0.8, 0.6), alpha=0.85)
  bandwidths = method.exchange.bandwidths
  assert bandwidths.smallest == compression.pick_parameter(
      'fedras', 1682, 32, 0.95
  )
  np.testing.assert_array_equal(
      bandwidths([0, 11]),
      [bandwidths.smallest, compression.pick_parameter(
          'fedras', 1682, 32, 0.6
      )],
  )
  # C_e (median 0.775) is 352 actions: 352 (1 - 0.5) > 71 rows.
  with pytest.raises(ValueError, match='raise alpha'):
    _fedras(data=data, embedding_dim=32,
            tier_compression_rates=(0.95, 0.8, 0.6), alpha=0.5)
  with pytest.raises(ValueError, match='tiers'):
    _fedras(num_items=1682, embedding_dim=32,
            tier_compression_rates=(0.95, 0.8, 0.6), alpha=0.85)


def test_alpha_too_small_for_the_bandwidth_range_is_refused():
  with pytest.raises(ValueError, match='raise alpha'):
    _fedras(num_items=1682, embedding_dim=32,
            compression_rate_range=(0.7, 0.9), alpha=0.2)
  with pytest.raises(ValueError, match='ablation'):
    _fedras(ablation='X')


def test_small_embedding_dim_meets_the_rate():
  assert fedras.small_embedding_dim(32, 0.9063) == 3
  assert fedras.small_embedding_dim(32, 0.9375) == 2
  assert fedras.small_embedding_dim(32, 0.9688) == 1
  assert fedras.small_embedding_dim(4, 0.75) == 1


def test_base_small_dim_counts_dense_rows_of_width_d_prime():
  method = fedras.build_base_small_dim(
      data=_run_data(), embedding_dim=_DIM, training=_TRAINING,
      compression_rate=0.5,
  )
  assert method.spec.embedding_dim == 2
  store = method.initial_store()
  state = method.process.initialize()
  for round_num, users in enumerate(_SCHEDULE):
    data = _client_data(users, round_num)
    result = _round(method, state, store, users, data, round_num)
    state = result.server_state
    sent = result.metrics
    rows = sum(len(np.unique(d['items'])) for d in data)
    # Each user's trained rows up, the whole [N, 2] table down.
    assert sent['upload_bytes'] == rows * 4 * 2
    assert sent['download_bytes'] == len(users) * 4 * _NUM_ITEMS * 2
    # One message each: the [N, 2] table against the [N, d] one.
    assert sent['message_download_bytes'] == sent['download_bytes']
    assert sent['dense_message_download_bytes'] == (
        len(users) * 4 * _NUM_ITEMS * _DIM
    )
    assert np.isfinite(sent['train_loss'])
  assert state['global_parameters']['item_embedding'].shape == (_NUM_ITEMS, 2)


def test_the_store_and_evaluation_work_with_client_copies():
  method = _fedras(compression_rate=_RATE, model='ncf', hidden_units=(3,))
  store = method.initial_store()
  state = method.process.initialize()
  result = _round(method, state, store, [0, 2], _client_data([0, 2], 0))
  positives = np.arange(_NUM_USERS)
  negatives = (positives[:, None] + np.arange(1, 6)) % _NUM_ITEMS
  scores = item_scoring.score_candidates(
      method.spec, method.global_parameters(result.server_state), store,
      np.concatenate([positives[:, None], negatives], axis=1),
  )
  # Scored with the server's Q and theta and each user's own p_u.
  params = collections.OrderedDict(
      method.global_parameters(result.server_state)
  )
  params['user_embedding'] = store.local_parameters([2])[0]['user_embedding']
  np.testing.assert_allclose(
      scores[2],
      models.logits(method.spec, params, tf.constant([2, 3, 4, 5, 6, 7])),
      rtol=1e-5,
  )
  assert store.bytes_per_user() >= _NUM_ITEMS * _DIM * 4
