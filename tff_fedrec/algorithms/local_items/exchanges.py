"""How the item table travels between server and clients: the exchanges.

An exchange is the part of a local-item-training method
(`local_item_training`) that the papers vary independently of the model
and of the local training: what the server sends (the distributor), what
item rows a client starts from, what it uploads of the rows it trained and
how the server aggregates that, and how many bytes each of those costs.

  BroadcastExchange    the server broadcasts its item table; a client
                       trains the rows of its items and uploads their
                       deltas row-sparse (PFedRec Sec. 4.3, FedMF, FedNCF),
                       or with LDP its whole table's delta plus Laplace
                       noise (PFedRec Sec. 6.6); the mean over users is
                       the server's update (Algorithm 1, line 6).
  CompressedExchange   every client keeps its own copy of the item table,
                       brought up to date by the server's encoded updates
                       (`distributors.CompressedDownlink`), and uploads its
                       rows encoded by a `row_codecs` codec under its
                       bandwidth e_u; the server decodes and averages them
                       (`aggregators.clustered_actions`): FedRAS (Lu et
                       al., KDD 2025) and the baselines of its Sec. 5.1.

Each comes with options (`BroadcastOptions`, `fedras.exchange.
FedRASOptions`, ...) whose `build(num_items=, embedding_dim=, seed=,
user_tiers=)` makes it for a given model, so a method's builder takes the
options and the program never needs the model's size to choose them.

An exchange has
  distributor                the `templates.distributors` role;
  replaces_trained_rows      whether the server sets trained item rows to
                             their aggregate instead of adding it;
  keeps_client_copies        whether each client keeps its own item table
                             (`item_copy` in its local state);
  item_factory()             the aggregation factory of the `item` upload;
  item_upload_type(dim)      that upload's type;
  local_state(table)         what it adds to a user's client state (numpy);
  start_rows(...)            TF: the rows a group of users starts from, the
                             state it keeps and client metrics;
  item_upload(...)           TF: the group's `item` upload;
  gradient_maps(...)         TF: per-user maps of the item-row gradients
                             (CoLR), or None;
  client_fields(users)       per-user client data it needs (bandwidth);
  round_bytes(...)           the round's bytes each way, measured, and what
                             the uncompressed exchange would have moved.

Byte accounting. Broadcast: a download is the global parameters, an upload
the dense global parameters plus 4 + 4 d bytes per uploaded row (id and
values), or the whole table with LDP. Compressed: `compression.
encoded_bytes` throughout (item ids not counted), theta (the global dense
parameters) whole each way; the uncompressed reference is the [N, d] table
each way per client, as FedRAS Sec. 5.1 counts its rate.
"""

import collections
import dataclasses
import functools
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec.algorithms.fedras import compression
from tff_fedrec import privacy
from tff_fedrec.algorithms.fedras import clustered_actions
from tff_fedrec.aggregators import sparse_rows
from tff_fedrec.templates import distributors

# Folded into a user's data seed for its k-means, so the clustering never
# shares a seed with the shuffles (seed + epoch).
_KMEANS_SEED_TAG = 1 << 29
# Folded into a user's data seed for its LDP noise, so the noise never
# shares a seed with a reshuffle.
_NOISE_SEED_TAG = 1 << 30


def parameter_bytes(params, keys) -> int:
  """Bytes of the parameters under `keys` (float32 values as sent)."""
  return sum(
      np.asarray(leaf).nbytes
      for key in keys
      for leaf in tf.nest.flatten(params[key])
  )


def dense_parameter_bytes(spec, params) -> int:
  """Bytes of theta, the global parameters other than the item table."""
  return parameter_bytes(
      params, [k for k in spec.global_keys if k != 'item_embedding']
  )


RoundBytes = collections.namedtuple(
    'RoundBytes',
    ['upload_bytes', 'download_bytes', 'dense_upload_bytes',
     'dense_download_bytes', 'message_download_bytes',
     'dense_message_download_bytes'],
)


@dataclasses.dataclass(frozen=True)
class BroadcastExchange:
  """The item table broadcast, row-sparse or LDP uploads (module docstring).

  Attributes:
    num_items: N.
    ldp_noise_scale: Laplace scale lambda of PFedRec Sec. 6.6; > 0 makes
      every upload the user's whole [N, d] delta plus its own noise (a
      sparse upload would reveal which rows it trained).
    reference_embedding_dim: None counts bytes as sent. FedRAS's "Base"
      (Sec. 5.1) trains at a small width d' and is compared with the
      width-d exchange: with d given, uploads count 4 d' bytes per row (no
      ids, as the compressed exchanges count), a download the whole [N, d']
      table, and the uncompressed reference is the same at width d.
  """

  num_items: int
  ldp_noise_scale: float = 0.0
  reference_embedding_dim: Optional[int] = None

  distributor = distributors.Broadcast()
  uses_bandwidth = False
  replaces_trained_rows = False
  keeps_client_copies = False

  def __post_init__(self):
    if not self.ldp_noise_scale >= 0.0:
      raise ValueError(
          f'ldp_noise_scale must be >= 0; got {self.ldp_noise_scale}.'
      )

  @property
  def dense_upload(self) -> bool:
    return self.ldp_noise_scale > 0

  def item_factory(self):
    """The mean over users of PFedRec Algorithm 1, line 6, weighted by the
    users of each TFF client."""
    if self.dense_upload:
      return tff.aggregators.MeanFactory()
    return sparse_rows.RowSparseMeanFactory(self.num_items)

  def item_upload_type(self, dim: int) -> tff.Type:
    if self.dense_upload:
      return tff.TensorType(np.float32, [self.num_items, dim])
    return sparse_rows.row_sparse_type(dim)

  def local_state(self, table: np.ndarray) -> collections.OrderedDict:
    del table
    return collections.OrderedDict()

  def start_rows(self, broadcast, local, data):
    """Each user's rows of the broadcast table, [U, T, d]."""
    del local
    rows = tf.gather(
        broadcast['global_parameters']['item_embedding'], data['row_ids']
    )
    return rows, collections.OrderedDict(), collections.OrderedDict()

  def gradient_maps(self, data, round_num, dim):
    del data, round_num, dim
    return None

  def item_upload(self, data, start_rows, trained_rows, round_num):
    del round_num
    row_deltas = trained_rows - start_rows
    num_users = tf.shape(data['row_ids'])[0]
    if self.dense_upload:
      return self._noised_table_upload(data, row_deltas)
    # Padding rows were never trained: their deltas are exactly 0.
    real_rows = tf.sequence_mask(
        data['num_rows'], tf.shape(data['row_ids'])[1]
    )
    return collections.OrderedDict(
        row_ids=tf.boolean_mask(data['row_ids'], real_rows),
        row_values=tf.boolean_mask(row_deltas, real_rows)
        / tf.cast(num_users, tf.float32),
    )

  def _noised_table_upload(self, data, row_deltas):
    """Sec. 6.6: each user's dense [N, d] delta plus its own Laplace noise,
    averaged over the group."""
    row_ids = data['row_ids']
    num_users = tf.shape(row_ids)[0]
    table_shape = [self.num_items, row_deltas.shape[-1]]
    user_index = tf.broadcast_to(
        tf.range(num_users)[:, None], tf.shape(row_ids)
    )
    table_deltas = tf.scatter_nd(
        tf.stack([user_index, row_ids], axis=-1),
        row_deltas,
        tf.concat([[num_users], table_shape], axis=0),
    )
    noise = tf.map_fn(
        lambda seed: privacy.laplace_noise(
            tf.constant(table_shape),
            self.ldp_noise_scale,
            seed=tf.random.experimental.stateless_fold_in(
                seed, _NOISE_SEED_TAG
            ),
        ),
        data['seeds'],
        fn_output_signature=tf.float32,
    )
    return tf.reduce_mean(table_deltas + noise, axis=0)

  def client_fields(self, users) -> dict:
    del users
    return {}

  def describe(self, num_users: int) -> dict:
    del num_users
    return {'kind': 'broadcast', 'ldp_noise_scale': self.ldp_noise_scale,
            'reference_embedding_dim': self.reference_embedding_dim}

  def description(self, num_users: int) -> str:
    del num_users
    text = 'broadcast'
    if self.dense_upload:
      text += f', LDP lambda {self.ldp_noise_scale:g}'
    if self.reference_embedding_dim is not None:
      text += (f', bytes against width {self.reference_embedding_dim}')
    return text

  def round_bytes(self, spec, initial_parameters, metrics,
                  num_clients: int) -> RoundBytes:
    theta = dense_parameter_bytes(spec, initial_parameters) * num_clients
    item = metrics['aggregator']['item']
    dim = spec.embedding_dim
    if self.reference_embedding_dim is None:
      download = parameter_bytes(
          initial_parameters, spec.global_keys
      ) * num_clients
      if self.dense_upload:
        upload = theta + num_clients * parameter_bytes(
            initial_parameters, ['item_embedding']
        )
      else:
        upload = theta + int(item['uploaded_rows']) * (4 + 4 * dim)
      return RoundBytes(upload, download, upload, download, download,
                        download)
    table = compression.dense_bytes(self.num_items, dim)
    full_table = compression.dense_bytes(
        self.num_items, self.reference_embedding_dim
    )
    upload = compression.FLOAT_BYTES * int(
        item['uploaded_rows']
    ) * dim + theta
    download = num_clients * table + theta
    dense = num_clients * full_table + theta
    # One message a round: the [N, d'] table, against the [N, d] one.
    return RoundBytes(upload, download, dense, dense, num_clients * table,
                      num_clients * full_table)


@dataclasses.dataclass(frozen=True)
class BroadcastOptions:
  """Options of a `BroadcastExchange`; `build` makes it for a model of
  `num_items` items (the other arguments are those every exchange's
  options take)."""

  ldp_noise_scale: float = 0.0
  reference_embedding_dim: Optional[int] = None

  def build(self, *, num_items: int, embedding_dim: int, seed: int,
            user_tiers=None) -> BroadcastExchange:
    del embedding_dim, seed, user_tiers
    return BroadcastExchange(
        num_items, ldp_noise_scale=self.ldp_noise_scale,
        reference_embedding_dim=self.reference_embedding_dim,
    )


def kmeans_seeds(seeds) -> tf.Tensor:
  """int64 [U, 2]: each user's k-means seed from its data seed [U, 2]."""
  return tf.map_fn(
      lambda seed: tf.cast(
          tf.random.experimental.stateless_fold_in(seed, _KMEANS_SEED_TAG),
          tf.int64,
      ),
      tf.convert_to_tensor(seeds, tf.int64),
  )


@dataclasses.dataclass(frozen=True)
class CompressedExchange:
  """Client copies of the item table, compressed both ways (FedRAS
  Algorithm 1; module docstring).

  A round for user u: catch up on the messages missed since its last round
  (`distributors.catch_up`); train from the rows of its copy; upload its
  rows' deltas (or, with `exchange_embeddings`, FedRAS-E, the trained
  rows) through `upload_codec` at bandwidth e_u; keep the caught-up copy,
  not its trained rows: the aggregate it receives next brings its own
  update back.

  Attributes:
    num_items: N.
    upload_codec: A `row_codecs` codec (its `training_gradient_map` shapes
      local training: CoLR).
    downlink_codec: A `downlink_codecs` codec of the server's messages.
    bandwidths: Callable user ids -> int32 e_u (`fedras.ClientBandwidths`).
    normalization: 'participation' (FedRAS Sec. 4.4) or 'clients' (FedAvg).
    exchange_embeddings: FedRAS-E: rows and messages carry embeddings and a
      client replaces its copy with the latest message.
    catch_up_rounds: H, the rounds of messages the server keeps; a client
      away longer downloads the table.
    resync_when_cheaper: a client whose missed messages cost more bytes
      than the table downloads the table instead (not in FedRAS's
      Algorithm 1, so off by default).
    seed: Seeds the round's shared seed (`distributors.round_seed`).
  """

  num_items: int
  upload_codec: object
  downlink_codec: object
  bandwidths: object
  normalization: str = 'participation'
  exchange_embeddings: bool = False
  catch_up_rounds: int = 32
  resync_when_cheaper: bool = False
  seed: int = 0

  uses_bandwidth = True
  # Every client's item_copy [N, d] in its local state.
  keeps_client_copies = True

  def __post_init__(self):
    if self.catch_up_rounds < 1:
      raise ValueError(
          f'catch_up_rounds must be >= 1; got {self.catch_up_rounds}.'
      )
    if self.normalization not in clustered_actions.NORMALIZATIONS:
      raise ValueError(
          f'normalization must be one of '
          f'{clustered_actions.NORMALIZATIONS}; got {self.normalization!r}.'
      )

  @property
  def replaces_trained_rows(self) -> bool:
    """FedRAS-E: the server sets each trained row to its aggregate."""
    return self.exchange_embeddings

  @functools.cached_property
  def distributor(self) -> distributors.CompressedDownlink:
    return distributors.CompressedDownlink(
        self.downlink_codec, history=self.catch_up_rounds,
        replaces=self.exchange_embeddings, seed=self.seed,
    )

  def item_factory(self):
    return clustered_actions.ClusteredActionsFactory(
        self.num_items, codec=self.upload_codec,
        normalization=self.normalization,
    )

  def item_upload_type(self, dim: int) -> tff.Type:
    return clustered_actions.upload_type(dim)

  def local_state(self, table: np.ndarray) -> collections.OrderedDict:
    """The initial Q (Alg. 1 line 1), synced at round 0."""
    return collections.OrderedDict(
        item_copy=np.asarray(table, np.float32),
        synced_round=np.int32(0),
    )

  def start_rows(self, broadcast, local, data):
    """Rows [U, T, d] of each user's caught-up copy, the copies to keep,
    and <download_bytes, resyncs, messages> of the catch-up."""
    copy, download_bytes, resynced, messages = distributors.catch_up(
        self.downlink_codec,
        replaces=self.exchange_embeddings,
        history=1 if self.exchange_embeddings else self.catch_up_rounds,
        copy=local['item_copy'],
        synced=local['synced_round'],
        round_num=broadcast['round_num'],
        downlink=broadcast['downlink'],
        table=broadcast['global_parameters']['item_embedding'],
        bandwidth=data['bandwidth'],
        resync_when_cheaper=self.resync_when_cheaper,
    )
    num_users = tf.shape(data['num_examples'])[0]
    kept = collections.OrderedDict(
        item_copy=copy,
        synced_round=tf.fill([num_users], broadcast['round_num']),
    )
    metrics = collections.OrderedDict(
        download_bytes=tf.reduce_sum(download_bytes),
        resyncs=tf.reduce_sum(tf.cast(resynced, tf.int32)),
        messages=tf.reduce_sum(messages),
    )
    return tf.gather(copy, data['row_ids'], batch_dims=1), kept, metrics

  def gradient_maps(self, data, round_num, dim):
    return self.upload_codec.training_gradient_map(
        data['num_rows'], data['bandwidth'], dim,
        distributors.round_seed(self.seed, round_num),
    )

  def item_upload(self, data, start_rows, trained_rows, round_num):
    return collections.OrderedDict(
        row_ids=data['row_ids'],
        num_rows=data['num_rows'],
        row_values=(
            trained_rows if self.exchange_embeddings
            else trained_rows - start_rows
        ),
        bandwidth=data['bandwidth'],
        seeds=kmeans_seeds(data['seeds']),
        shared_seed=distributors.round_seed(self.seed, round_num),
    )

  def client_fields(self, users) -> dict:
    return {'bandwidth': np.asarray(self.bandwidths(users), np.int32)}

  def _rates(self, num_users: int) -> dict:
    """{requested rate: (users, e_u)} of per-user rates, else {}."""
    rates = self.bandwidths.user_rates
    if rates is None:
      return {}
    rates = np.asarray(rates)[:num_users]
    result = {}
    for rate in sorted(set(rates.tolist()), reverse=True):
      users = np.flatnonzero(rates == rate)
      result[f'{rate:g}'] = (len(users), int(self.bandwidths(users[:1])[0]))
    return result

  def describe(self, num_users: int) -> dict:
    return {
        'kind': 'compressed',
        'upload_codec': type(self.upload_codec).__name__,
        'downlink_codec': type(self.downlink_codec).__name__,
        'compression_rate': self.bandwidths.compression_rate,
        'expected_groups': self.bandwidths.expected_groups,
        'normalization': self.normalization,
        'exchange_embeddings': self.exchange_embeddings,
        'catch_up_rounds': self.catch_up_rounds,
        'resync_when_cheaper': self.resync_when_cheaper,
        'users_per_tier_rate': {
            rate: users for rate, (users, _) in self._rates(num_users).items()
        },
    }

  def description(self, num_users: int) -> str:
    text = (f'{type(self.upload_codec).__name__} up, '
            f'{type(self.downlink_codec).__name__} down, C_e '
            f'{self.bandwidths.expected_groups} rows')
    rates = self._rates(num_users)
    if rates:
      text += '; bandwidths e_u per tier: ' + ', '.join(
          f'rate {rate} -> {rows} rows ({users} users)'
          for rate, (users, rows) in rates.items()
      )
    return text

  def round_bytes(self, spec, initial_parameters, metrics,
                  num_clients: int) -> RoundBytes:
    theta = dense_parameter_bytes(spec, initial_parameters) * num_clients
    table = compression.dense_bytes(
        self.num_items, spec.embedding_dim
    )
    client = metrics['client_work']
    download_bytes = int(client['download_bytes'])
    dense = num_clients * table + theta
    return RoundBytes(
        upload_bytes=int(
            metrics['aggregator']['item']['uploaded_bytes']
        ) + theta,
        download_bytes=download_bytes + theta,
        dense_upload_bytes=dense,
        dense_download_bytes=dense,
        message_download_bytes=download_bytes
        - int(client['resyncs']) * table,
        dense_message_download_bytes=int(client['messages']) * table,
    )
