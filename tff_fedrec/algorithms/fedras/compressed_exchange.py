"""FedRAS's exchange of the item table (Lu et al., KDD 2025, Algorithm 1),
as a local-item method's `local_items.exchanges.Exchange`.

Every client keeps its own copy of the item table, brought up to date by
the server's encoded updates (`downlink.CompressedDownlink`), and uploads
its rows encoded by a `row_codecs` codec under its bandwidth e_u; the
server decodes and averages them (`clustered_actions`) and applies the
mean (`downlink.ApplyActions`). FedRAS and the codec baselines of its Sec.
5.1 are this exchange with other codecs (`exchange`).

Byte accounting: `compression.encoded_bytes` throughout (item ids not
counted), theta (the global dense parameters) whole each way; the
uncompressed reference is the [N, d] table each way per client, as FedRAS
Sec. 5.1 counts its rate.

Example:
  >>> exchange = exchange_lib.FedRASOptions().build(
  ...     num_items=1682, embedding_dim=32, seed=0)  # a CompressedExchange
"""

import collections
import dataclasses
import functools

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec.algorithms.fedras import clustered_actions
from tff_fedrec.algorithms.fedras import compression
from tff_fedrec.algorithms.fedras import downlink
from tff_fedrec.algorithms.local_items import exchanges

# Folded into a user's data seed for its k-means, so the clustering never
# shares a seed with the shuffles (seed + epoch).
_KMEANS_SEED_TAG = 1 << 29


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
  (`downlink.catch_up`); train from the rows of its copy; upload its
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
    seed: Seeds the round's shared seed (`downlink.round_seed`).
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

  # Every client's item_copy [N, d] in its local state.
  keeps_table_on_clients = True

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

  def finalizer(self) -> downlink.ApplyActions:
    """The table moves by the actions' mean; FedRAS-E: the server sets
    each trained row to its aggregate."""
    return downlink.ApplyActions(
        replaces_trained_rows=self.exchange_embeddings)

  @functools.cached_property
  def distributor(self) -> downlink.CompressedDownlink:
    return downlink.CompressedDownlink(
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

  def data_type_fields(self) -> dict:
    return {'bandwidth': tff.TensorType(np.int32, [None])}

  def client_table_vectors(self, local_state, items) -> np.ndarray:
    """Each user's copy of the table it started its last round from."""
    return np.take_along_axis(
        np.asarray(local_state['item_copy']), items[..., None], axis=1)

  def start_rows(self, broadcast, local, data):
    """Rows [U, T, d] of each user's caught-up copy, the copies to keep,
    and <download_bytes, resyncs, messages> of the catch-up."""
    copy, download_bytes, resynced, messages = downlink.catch_up(
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
        downlink.round_seed(self.seed, round_num),
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
        shared_seed=downlink.round_seed(self.seed, round_num),
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
                  num_clients: int) -> exchanges.RoundBytes:
    theta = exchanges.dense_parameter_bytes(spec, initial_parameters) * (
        num_clients)
    table = compression.dense_bytes(
        self.num_items, spec.embedding_dim
    )
    client = metrics['client_work']
    download_bytes = int(client['download_bytes'])
    dense = num_clients * table + theta
    return exchanges.RoundBytes(
        upload_bytes=int(
            metrics['aggregator']['item_embedding']['uploaded_bytes']
        ) + theta,
        download_bytes=download_bytes + theta,
        dense_upload_bytes=dense,
        dense_download_bytes=dense,
        message_download_bytes=download_bytes
        - int(client['resyncs']) * table,
        dense_message_download_bytes=int(client['messages']) * table,
    )
