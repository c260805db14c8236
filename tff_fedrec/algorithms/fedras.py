"""FedRAS (Lu et al., KDD 2025) and the compression baselines of its Sec. 5.1.

FedRAS ("Gradients as an Action") sends item-embedding updates as shared
actions, both ways: the k-means centroids of the gradient rows plus a group
index per row (Sec. 4.2). A client uploads its rows clustered into at most
e_u actions (its bandwidth in rows, Alg. 1 lines 26-29); the server
averages each item over the clients that trained it (Sec. 4.4) and sends
the aggregate compressed by adaptive cluster-and-split (Sec. 4.3), one
matrix per bandwidth; every client keeps its own copy of the item table
and applies the actions it receives (line 24). The process is
`compressed_exchange.build_compressed_exchange_process` (its docstring has
the round and the federated types); this module picks its codecs and
parameters and wraps it as a `method.FederatedMethod`.

Builders, all with `fedmf.build_fedmf`'s keyword arguments (num_items,
embedding_dim, hidden_units, training, seed, model_aggregator,
item_aggregator) plus `model` ('mf': FedMF, 'ncf': FedNCF with a global
MLP, Sec. 5.1) and `compression_rate` (CR = 1 - bytes / dense bytes of the
[N, d] table, Sec. 5.1):

  build_fedras  FedRAS; `ablation` 'E' (cluster embeddings, not gradients),
                'F' (alpha = 0: fixed k), 'T' (FedAvg aggregation), Sec.
                5.4.1; `compression_rate_range` for per-user bandwidths
                (Sec. 5.5), `user_compression_rates` for given ones (e.g.
                per device tier).
  build_topk, build_svd, build_colr  the baselines Topk, SVD and CoLR: the
                same client copies, catch-up and byte accounting, and
                FedAvg aggregation ("the classical FL algorithm FedAvg").
                Their download has the k or rank
                `gradient_compression.pick_parameter` gives the [N, d]
                table at the rate; their uploads get FedRAS's per-user
                byte budget (`row_codecs.upload_budget`).
  build_base_small_dim  "Base": FedMF / FedNCF (`partially_local`) with
                the embedding width d' whose dense table meets the rate.

Byte accounting is `gradient_compression.encoded_bytes` throughout: an
upload covers the T_u rows of the client's items (their ids not counted),
a download all N rows; theta (NCF's MLP) is sent whole each way.
`run_round` returns `CompressedRoundResult`, `method.RoundResult` plus the
round's download bytes and what the uncompressed exchange would have moved
(`dense_upload_bytes`, `dense_download_bytes`: the [N, d] item matrix per
client each way, as Sec. 5.1 counts the rate, and theta), from which the
program reports the measured compression rate. A client that missed rounds
catches up on several messages, so the download's rate is also given per
message (`message_download_bytes`: the item messages applied, without full
resyncs or theta; `dense_message_download_bytes`: the [N, d] matrix per
message applied), the rate of Algorithm 1, where each client gets one
message a round.

Interpretations of the paper:
  - e_u and C_e come from `pick_parameter('fedras', N, d, CR)`, which counts
    the group indices the paper leaves out (Sec. 5.1); C_e = 92 instead of
    N (1 - CR) = 105 for ML-100K at CR = 93.75%.
  - A client away from rounds catches up on every message it missed, up to
    H = `catch_up_rounds` rounds kept by the server, and downloads the
    server's table in full beyond that, or (`resync_when_cheaper`, the
    default) as soon as the missed messages cost more bytes than the
    table; its download bytes count them all.
    Algorithm 1 shows one message per round, as if every client were
    present every round.
  - FedRAS-E uploads clustered trained embeddings; the server sets each
    trained item to the participation mean of the decoded rows and sends
    the whole table clustered; clients replace their copies.
  - The paper sets one rate for every method and no per-user rule for the
    baselines' uploads. Each user's upload gets the bytes its FedRAS upload
    would take, 4 min(T_u, e_u) d + T_u index_bytes(min(T_u, e_u) + 1),
    and the largest k or rank that fits (`row_codecs.budget_parameter`),
    so measured uplink rates match FedRAS's. A k or rank picked for the
    [N, d] table and used on a user's T_u rows uploads about a third of
    FedRAS's bytes.
  - CoLR's client trains A through the loss as the authors' public code
    does: its item-row gradients are mapped into the row space of the
    round's shared B, scaled by sqrt(d / r_u)
    (`gradient_compression.colr_gradient_map`); unlike that code, the
    baselines aggregate by FedAvg, as the paper compares them.
  - NCF's three feedforward layers of 64, 32 and 16 units are the hidden
    layers of the MLP on [p_u; q_i] (`NCF_HIDDEN_UNITS`), before the
    output layer.
  - Evaluation scores with the server's Q and theta and each user's p_u.

Example:
  >>> method = build_fedras(num_items=1682, compression_rate=0.9375)
  >>> method.bandwidths.expected_groups  # C_e for ML-100K, d = 32
  92
"""

import collections
import dataclasses
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import action_clustering
from tff_fedrec import gradient_compression
from tff_fedrec import models
from tff_fedrec.aggregators import row_codecs
from tff_fedrec.algorithms import compressed_exchange
from tff_fedrec.algorithms import downlink_codecs
from tff_fedrec.algorithms import method
from tff_fedrec.algorithms import partially_local
from tff_fedrec.algorithms import two_phase
from tff_fedrec.algorithms import user_groups

# Sec. 5.1: SGD, batch size 256, 2 local epochs; 4 negatives per positive
# are the training loop's (`LoopConfig.negatives_per_positive`).
PAPER_TRAINING = partially_local.ClientTrainingConfig(
    batch_size=256, local_epochs=2, dual_personalization=False
)
# Sec. 5.1: "three feedforward layers with 64, 32, and 16 dimensions".
NCF_HIDDEN_UNITS = (64, 32, 16)
MODELS = ('mf', 'ncf')
ABLATIONS = ('E', 'F', 'T')
DEFAULT_ALPHA = 0.2  # Sec. 5.1.

CompressedRoundResult = collections.namedtuple(
    'CompressedRoundResult',
    [*method.RoundResult._fields, 'download_bytes', 'dense_upload_bytes',
     'dense_download_bytes', 'message_download_bytes',
     'dense_message_download_bytes'],
)


def _dense_bytes(spec, params, embedding_dim, num_clients):
  """(upload, download) bytes of the uncompressed exchange at width
  `embedding_dim`: the [N, d] item matrix each way per client, as the
  paper's rate counts it (Sec. 5.1: e_u = N (1 - CR) rows), theta both
  ways."""
  per_client = gradient_compression.dense_bytes(
      spec.num_items, embedding_dim
  ) + _dense_parameter_bytes(spec, params)
  return num_clients * per_client, num_clients * per_client


@dataclasses.dataclass(frozen=True)
class ClientBandwidths:
  """Each user's bandwidth e_u in item rows (Sec. 4.1, 5.1, 5.5).

  Homogeneous (the paper's main runs, Sec. 5.1): e_u = C_e for all, the
  FedRAS action count whose message meets `compression_rate`
  (`gradient_compression.pick_parameter('fedras', N, d, rate)`, counting
  the group indices; the paper's N (1 - CR) omits them). Heterogeneous
  (Sec. 5.5): user u draws its rate CR_u uniformly from
  `compression_rate_range` once (seeded by (seed, u), so every round and a
  resumed run agree), and e_u is the action count for CR_u; C_e is that of
  the range's middle ("related to the median"). Given per user
  (`user_rates`, e.g. one rate per device tier, Sec. 4.1): e_u is the
  action count for user u's rate, and C_e that of the users' median rate.

  Example: N = 1682, d = 32, rate 0.9375: e_u = C_e = 92 for every user.
  """

  num_items: int
  dim: int
  compression_rate: float
  compression_rate_range: Optional[tuple[float, float]] = None
  seed: int = 0
  user_rates: Optional[tuple[float, ...]] = None
  _cache: dict = dataclasses.field(
      default_factory=dict, compare=False, repr=False
  )

  def __post_init__(self):
    if self.compression_rate_range is not None:
      low, high = self.compression_rate_range
      if not 0.0 <= low <= high < 1.0:
        raise ValueError(
            'compression_rate_range must be (low, high) with 0 <= low <= '
            f'high < 1; got {self.compression_rate_range}.'
        )
    if self.user_rates is not None:
      if self.compression_rate_range is not None:
        raise ValueError(
            'Give either compression_rate_range or user_rates, not both.'
        )
      rates = np.asarray(self.user_rates, np.float64)
      if rates.ndim != 1 or not rates.size:
        raise ValueError('user_rates must hold one rate per user.')
      if not np.all((rates >= 0.0) & (rates < 1.0)):
        raise ValueError(
            f'user_rates must lie in [0, 1); got {rates.min()} to '
            f'{rates.max()}.'
        )

  def _actions(self, rate: float) -> int:
    return gradient_compression.pick_parameter(
        'fedras', self.num_items, self.dim, rate
    )

  @property
  def expected_groups(self) -> int:
    """C_e."""
    if self.user_rates is not None:
      return self._actions(float(np.median(self.user_rates)))
    if self.compression_rate_range is None:
      return self._actions(self.compression_rate)
    return self._actions(sum(self.compression_rate_range) / 2)

  @property
  def smallest(self) -> int:
    """The smallest e_u any user can have."""
    if self.user_rates is not None:
      return self._actions(max(self.user_rates))
    if self.compression_rate_range is None:
      return self.expected_groups
    return self._actions(self.compression_rate_range[1])

  def _rate(self, user: int) -> float:
    """User u's rate: given, or drawn from the range seeded by (seed, u)."""
    if self.user_rates is not None:
      return float(self.user_rates[user])
    low, high = self.compression_rate_range
    return float(
        np.random.default_rng([self.seed, int(user)]).uniform(low, high)
    )

  def __call__(self, users) -> np.ndarray:
    """int32 [len(users)]: e_u of each user id."""
    if self.user_rates is None and self.compression_rate_range is None:
      return np.full([len(users)], self.expected_groups, np.int32)
    users = np.asarray(users, np.int64)
    if self.user_rates is not None and users.size and not (
        0 <= users.min() <= users.max() < len(self.user_rates)
    ):
      raise ValueError(
          f'user ids must lie in [0, {len(self.user_rates)}), the users '
          'with a rate.'
      )
    values = []
    for user in users:
      rate = self._rate(user)
      if rate not in self._cache:
        self._cache[rate] = self._actions(rate)
      values.append(self._cache[rate])
    return np.asarray(values, np.int32)


def _dense_parameter_bytes(spec, params) -> int:
  """Bytes of theta, sent whole each way by every client."""
  return method.parameter_bytes(
      params, [k for k in spec.global_keys if k != 'item_embedding']
  )


@dataclasses.dataclass(frozen=True)
class CompressedMethod(method.FederatedMethod):
  """FedRAS or a baseline with client copies (`method.FederatedMethod`).

  The client state's `local_parameters` hold p_u and the client's item
  table copy and sync round (`compressed_exchange.initial_client_state`);
  evaluation uses the server's Q and theta (`global_parameters`) with each
  p_u.

  Attributes:
    bandwidths: e_u of each user, unless the client data gives one.
    scheme: the `gradient_compression` scheme of the item messages.
  """

  bandwidths: ClientBandwidths
  scheme: str

  def upload_bytes(self, metrics, num_clients: int) -> int:
    """Item messages as measured by the aggregator, plus theta each."""
    return int(metrics['aggregator']['item']['uploaded_bytes']) + (
        num_clients
        * _dense_parameter_bytes(self.spec, self.initial_parameters)
    )

  def download_bytes(self, metrics, num_clients: int) -> int:
    """Messages (or full tables) the clients caught up with, plus theta."""
    return int(metrics['download_bytes']) + num_clients * (
        _dense_parameter_bytes(self.spec, self.initial_parameters)
    )

  def run_round(
      self, server_state, store, users, client_data, examples, *,
      users_per_client: int = 1,
  ):
    """One round for `users`, `users_per_client` of them per TFF client;
    their new states go to `store` (`ClientStateStore`)."""
    del examples
    users = np.asarray(users)
    bandwidth = self.bandwidths(users)
    for position, data in enumerate(client_data):
      if 'bandwidth' in data:
        bandwidth[position] = int(data['bandwidth'])
    groups = user_groups.group_positions(
        [len(d['items']) for d in client_data], users_per_client
    )
    local = store.stacked_local_parameters(users)
    group_data, group_local = [], []
    for positions in groups:
      data = user_groups.group_client_data(
          [client_data[p] for p in positions]
      )
      data['bandwidth'] = bandwidth[positions]
      group_data.append(data)
      group_local.append(
          tf.nest.map_structure(lambda leaf, p=positions: leaf[p], local)
      )
    server_state, new_local, metrics = two_phase.run_round(
        self.process, server_state, group_local, group_data
    )
    for positions, state in zip(groups, new_local):
      store.put_local_parameters(users[positions], state)
    dense_upload, dense_download = _dense_bytes(
        self.spec, self.initial_parameters, self.spec.embedding_dim,
        len(users),
    )
    table_bytes = gradient_compression.dense_bytes(
        self.spec.num_items, self.spec.embedding_dim
    )
    return CompressedRoundResult(
        server_state=server_state,
        train_loss=float(metrics['train_loss']),
        upload_bytes=self.upload_bytes(metrics, len(users)),
        download_bytes=self.download_bytes(metrics, len(users)),
        dense_upload_bytes=dense_upload,
        dense_download_bytes=dense_download,
        message_download_bytes=int(metrics['download_bytes'])
        - int(metrics['resyncs']) * table_bytes,
        dense_message_download_bytes=int(metrics['messages']) * table_bytes,
    )


def _spec(model: str, num_items: int, embedding_dim: int, hidden_units):
  if model not in MODELS:
    raise ValueError(f'model must be one of {MODELS}; got {model!r}.')
  if model == 'mf':
    if hidden_units:
      raise ValueError('MF has no score layers; drop hidden_units.')
    return models.RecommenderSpec(
        'matrix_factorization', num_items, embedding_dim
    )
  return models.RecommenderSpec(
      'neural_cf', num_items, embedding_dim,
      tuple(hidden_units) or NCF_HIDDEN_UNITS, personal_score_layers=False,
  )


def _build(
    spec, training, seed, bandwidths, *, scheme, upload_codec, downlink_codec,
    **process_options,
) -> CompressedMethod:
  params = models.initial_parameters(spec, seed)
  return CompressedMethod(
      spec=spec,
      initial_parameters=params,
      initial_client_state=compressed_exchange.initial_client_state(
          spec, params
      ),
      process=compressed_exchange.build_compressed_exchange_process(
          spec, params, training,
          upload_codec=upload_codec,
          downlink_codec=downlink_codec,
          seed=seed,
          **process_options,
      ),
      bandwidths=bandwidths,
      scheme=scheme,
  )


def build_fedras(
    *,
    num_items: int,
    embedding_dim: int = 32,
    hidden_units: tuple[int, ...] = (),
    training: partially_local.ClientTrainingConfig = PAPER_TRAINING,
    seed: int = 0,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    item_aggregator: Optional[tff.aggregators.UnweightedAggregationFactory] = None,
    model: str = 'mf',
    compression_rate: float = 0.9375,
    alpha: float = DEFAULT_ALPHA,
    ablation: Optional[str] = None,
    compression_rate_range: Optional[tuple[float, float]] = None,
    user_compression_rates: Optional[Sequence[float]] = None,
    catch_up_rounds: int = compressed_exchange.DEFAULT_CATCH_UP_ROUNDS,
    resync_when_cheaper: bool = True,
    num_iterations: int = action_clustering.DEFAULT_LLOYD_ITERATIONS,
) -> CompressedMethod:
  """Builds FedRAS (module docstring) on FedMF (`model='mf'`) or FedNCF.

  Args:
    num_items, embedding_dim, hidden_units, training, seed,
      model_aggregator, item_aggregator: as `fedmf.build_fedmf`;
      hidden_units () means `NCF_HIDDEN_UNITS` for NCF.
    model: 'mf' or 'ncf'.
    compression_rate: CR of Sec. 5.1; sets C_e and every e_u.
    alpha: the fluctuation factor of Sec. 4.3.
    ablation: None, 'E', 'F' (alpha = 0) or 'T' (Sec. 5.4.1).
    compression_rate_range: (low, high): heterogeneous e_u (Sec. 5.5).
    user_compression_rates: each user's rate, by user id (e.g. one per
      device tier); exclusive with compression_rate_range.
    catch_up_rounds: H, how many rounds of messages the server keeps.
    resync_when_cheaper: a returning client downloads the table when its
      missed messages would cost more (`compressed_exchange.catch_up`).
    num_iterations: Lloyd steps of every k-means.
  """
  if ablation is not None and ablation not in ABLATIONS:
    raise ValueError(f'ablation must be None or one of {ABLATIONS}.')
  if ablation == 'F':
    alpha = 0.0
  spec = _spec(model, num_items, embedding_dim, hidden_units)
  bandwidths = ClientBandwidths(
      num_items, embedding_dim, compression_rate, compression_rate_range, seed,
      user_rates=None if user_compression_rates is None else tuple(
          float(rate) for rate in user_compression_rates
      ),
  )
  downlink_codec = downlink_codecs.ClusteredActionsDownlink(
      num_items, embedding_dim,
      expected_groups=bandwidths.expected_groups, alpha=alpha,
      num_iterations=num_iterations,
  )
  if downlink_codec.initial_groups > bandwidths.smallest:
    raise ValueError(
        f'C_e (1 - alpha) = {downlink_codec.initial_groups} groups exceeds '
        f'the smallest bandwidth, {bandwidths.smallest} rows: raise alpha '
        '(Sec. 5.5 adjusts it to the range).'
    )
  return _build(
      spec, training, seed, bandwidths,
      scheme='fedras',
      upload_codec=row_codecs.ClusteredActions(num_iterations),
      downlink_codec=downlink_codec,
      exchange_embeddings=ablation == 'E',
      normalization='clients' if ablation == 'T' else 'participation',
      catch_up_rounds=catch_up_rounds,
      resync_when_cheaper=resync_when_cheaper,
      item_aggregator=item_aggregator,
      model_aggregator=model_aggregator,
  )


# scheme -> (upload codec, downlink codec).
_BASELINE_CODECS = {
    'top_k': (row_codecs.TopK, downlink_codecs.TopKDownlink),
    'svd': (row_codecs.Svd, downlink_codecs.SvdDownlink),
    'colr': (row_codecs.Colr, downlink_codecs.ColrDownlink),
}


def baseline_codecs(
    scheme: str, num_items: int, embedding_dim: int, compression_rate: float
):
  """(upload codec, downlink codec) of a baseline (`build_compressed_baseline`
  describes their parameters)."""
  if scheme not in _BASELINE_CODECS:
    raise ValueError(
        f'scheme must be one of {tuple(_BASELINE_CODECS)}; got {scheme!r}.'
    )
  upload, downlink = _BASELINE_CODECS[scheme]
  return upload(), downlink(
      num_items, embedding_dim,
      gradient_compression.pick_parameter(
          scheme, num_items, embedding_dim, compression_rate
      ),
  )


def build_compressed_baseline(
    scheme: str,
    *,
    num_items: int,
    embedding_dim: int = 32,
    hidden_units: tuple[int, ...] = (),
    training: partially_local.ClientTrainingConfig = PAPER_TRAINING,
    seed: int = 0,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    item_aggregator: Optional[tff.aggregators.UnweightedAggregationFactory] = None,
    model: str = 'mf',
    compression_rate: float = 0.9375,
    catch_up_rounds: int = compressed_exchange.DEFAULT_CATCH_UP_ROUNDS,
    resync_when_cheaper: bool = True,
) -> CompressedMethod:
  """Topk, SVD or CoLR of Sec. 5.1 (`scheme` 'top_k', 'svd' or 'colr').

  Upload: each user's k_u or rank r_u is the largest whose message fits
  the bytes of its FedRAS upload at bandwidth e_u (C_e unless the client
  data gives one; `row_codecs.TopK`, `Svd`, `Colr`).
  Download: the k or rank `gradient_compression.pick_parameter(scheme, N,
  d, compression_rate)` of the [N, d] table. Aggregation is FedAvg. Other
  arguments as `build_fedras`.

  Example: N = 24, d = 4, rate 0.78 (C_e = 4): a user with T_u = 7 rows
  has B_u = 4 * 4 * 4 + 7 * 1 = 71 bytes and uploads top-k k_u =
  floor(71 / 35) = 2, svd r_u = floor(71 / 44) = 1 or colr r_u =
  floor(71 / 28) = 2; the download uses k = r = 1.
  """
  upload_codec, downlink_codec = baseline_codecs(
      scheme, num_items, embedding_dim, compression_rate
  )
  return _build(
      _spec(model, num_items, embedding_dim, hidden_units), training, seed,
      ClientBandwidths(num_items, embedding_dim, compression_rate, None, seed),
      scheme=scheme,
      upload_codec=upload_codec,
      downlink_codec=downlink_codec,
      normalization='clients',
      catch_up_rounds=catch_up_rounds,
      resync_when_cheaper=resync_when_cheaper,
      item_aggregator=item_aggregator,
      model_aggregator=model_aggregator,
  )


def build_topk(**kwargs) -> CompressedMethod:
  """Topk of Sec. 5.1; see `build_compressed_baseline`."""
  return build_compressed_baseline('top_k', **kwargs)


def build_svd(**kwargs) -> CompressedMethod:
  """SVD of Sec. 5.1; see `build_compressed_baseline`."""
  return build_compressed_baseline('svd', **kwargs)


def build_colr(**kwargs) -> CompressedMethod:
  """CoLR of Sec. 5.1; see `build_compressed_baseline`."""
  return build_compressed_baseline('colr', **kwargs)


def small_embedding_dim(embedding_dim: int, compression_rate: float) -> int:
  """d' in [1, d] whose dense table's CR = 1 - d'/d is closest to the rate
  (ties to the smaller), "Base" of Sec. 5.1.

  Example: d = 32 at 0.9375 gives 2; at 0.9063, 3; at 0.9688, 1.
  """
  return min(
      range(1, embedding_dim + 1),
      key=lambda width: abs(1.0 - width / embedding_dim - compression_rate),
  )


@dataclasses.dataclass(frozen=True)
class SmallDimMethod(method.FederatedMethod):
  """FedMF / FedNCF at width d' (`partially_local`), bytes counted as the
  compressed methods count them: an upload is the dense [T_u, d'] rows of
  the client's items (ids not counted), a download the dense [N, d']
  table; theta whole each way. The uncompressed reference is the same
  exchange at `full_embedding_dim` d.

  Attributes:
    full_embedding_dim: d, the width the compression rate refers to.
  """

  full_embedding_dim: int = 32

  def upload_bytes(self, metrics, num_clients: int) -> int:
    rows = int(metrics['aggregator']['item']['uploaded_rows'])
    return gradient_compression.FLOAT_BYTES * rows * self.spec.embedding_dim + (
        num_clients
        * _dense_parameter_bytes(self.spec, self.initial_parameters)
    )

  def download_bytes(self, metrics, num_clients: int) -> int:
    del metrics  # Every client gets the whole table.
    return num_clients * (
        gradient_compression.dense_bytes(
            self.spec.num_items, self.spec.embedding_dim
        )
        + _dense_parameter_bytes(self.spec, self.initial_parameters)
    )

  def run_round(self, server_state, store, users, client_data, examples, *,
                users_per_client: int = 1):
    result = super().run_round(
        server_state, store, users, client_data, examples,
        users_per_client=users_per_client,
    )
    dense_upload, dense_download = _dense_bytes(
        self.spec, self.initial_parameters, self.full_embedding_dim,
        len(users),
    )
    # One message a round: the [N, d'] table, against the [N, d] one.
    return CompressedRoundResult(
        *result, download_bytes=self.download_bytes(None, len(users)),
        dense_upload_bytes=dense_upload, dense_download_bytes=dense_download,
        message_download_bytes=len(users) * gradient_compression.dense_bytes(
            self.spec.num_items, self.spec.embedding_dim
        ),
        dense_message_download_bytes=len(users)
        * gradient_compression.dense_bytes(
            self.spec.num_items, self.full_embedding_dim
        ),
    )


def build_base_small_dim(
    *,
    num_items: int,
    embedding_dim: int = 32,
    hidden_units: tuple[int, ...] = (),
    training: partially_local.ClientTrainingConfig = PAPER_TRAINING,
    seed: int = 0,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    item_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    model: str = 'mf',
    compression_rate: float = 0.9375,
) -> SmallDimMethod:
  """"Base" of Sec. 5.1: FedAvg on FedMF / FedNCF with every embedding of
  width `small_embedding_dim(embedding_dim, compression_rate)`; the NCF
  MLP keeps its hidden units. Arguments as `build_fedras`."""
  if training.dual_personalization:
    raise ValueError('Base is plain FedAvg: no dual personalization.')
  spec = _spec(
      model, num_items, small_embedding_dim(embedding_dim, compression_rate),
      hidden_units,
  )
  params = models.initial_parameters(spec, seed)
  return SmallDimMethod(
      full_embedding_dim=embedding_dim,
      spec=spec,
      initial_parameters=params,
      initial_client_state=partially_local.initial_client_state(spec, params),
      process=partially_local.build_partially_local_process(
          spec, params, training,
          item_aggregator=item_aggregator, model_aggregator=model_aggregator,
      ),
  )
