"""How the item table travels between server and clients: the exchanges.

An exchange is the part of a local-item-training method (`client_training`)
that the papers vary independently of the model and of the local training:
what the server sends (the distributor), what item rows a client starts
from, what it uploads of the rows it trained, how the server aggregates
that and applies it (the finalizer), and how many bytes each of those
costs. Every exchange plays `Exchange`:

  BroadcastExchange    here: the server broadcasts its item table; a
                       client trains the rows of its items and uploads
                       their deltas row-sparse (PFedRec Sec. 4.3, FedMF,
                       FedNCF), or with LDP its whole table's delta plus
                       Laplace noise (PFedRec Sec. 6.6); the mean over users
                       is the server's update (Algorithm 1, line 6).
  FedRAS's             every client keeps its own copy of the table, brought
                       up to date by the server's encoded updates, and
                       uploads its rows encoded under its bandwidth
                       (`fedras.compressed_exchange`); its "Base" broadcasts
                       a narrower table (`fedras.exchange`).

Each comes with options (`BroadcastOptions`, `fedras.exchange.
FedRASOptions`, ...) whose `build(num_items=, embedding_dim=, seed=,
user_tiers=)` makes it for a given model, so a method's builder takes the
options and the program never needs the model's size to choose them.

Byte accounting of the broadcast: a download is the global parameters, an
upload the dense global parameters plus 4 + 4 d bytes per uploaded row (id
and values), or the whole table with LDP.
"""

import collections
import dataclasses
from typing import Protocol, runtime_checkable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import privacy
from tff_fedrec.aggregators import sparse_rows
from tff_fedrec.templates import distributors
from tff_fedrec.templates import finalizers

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


@runtime_checkable
class Exchange(Protocol):
  """How the item table travels (module docstring).

  Attributes:
    distributor: The `templates.roles.Distributor` of the table.
    keeps_table_on_clients: Whether every client keeps its own copy of the
      table in its local state (`client_table_vectors` reads it).
  """

  distributor: object
  keeps_table_on_clients: bool

  def finalizer(self):
    """The `templates.roles.Finalizer` that applies the aggregate."""

  def item_factory(self):
    """The `tff.aggregators` factory of the `item_embedding` upload."""

  def item_upload_type(self, dim: int) -> tff.Type:
    """That upload's type."""

  def local_state(self, table: np.ndarray) -> collections.OrderedDict:
    """What it adds to a user's client state (numpy), from the initial
    table."""

  def data_type_fields(self) -> dict:
    """The per-user client data fields it needs, name -> TFF type."""

  def client_fields(self, users) -> dict:
    """Their values for `users` (numpy, leading [len(users)])."""

  def start_rows(self, broadcast, local, data):
    """TF: (the rows [U, T, d] a group of users starts from, the state it
    keeps, client metrics)."""

  def item_upload(self, data, start_rows, trained_rows, round_num):
    """TF: the group's `item_embedding` upload."""

  def gradient_maps(self, data, round_num, dim):
    """TF: per-user maps [U, d, d] of the item-row gradients, or None."""

  def client_table_vectors(self, local_state, items) -> np.ndarray:
    """The rows [U, C, d] of `items` [U, C] of the users' own copies of
    the table (`keeps_table_on_clients` only)."""

  def round_bytes(self, spec, initial_parameters, metrics,
                  num_clients: int) -> RoundBytes:
    """The round's bytes each way, measured, and what the uncompressed
    exchange would have moved."""

  def describe(self, num_users: int) -> dict:
    """What it is, for the run's summary."""

  def description(self, num_users: int) -> str:
    """One line on it, for the log."""


@dataclasses.dataclass(frozen=True)
class BroadcastExchange:
  """The item table broadcast, row-sparse or LDP uploads (module docstring).

  Attributes:
    num_items: N.
    ldp_noise_scale: Laplace scale lambda of PFedRec Sec. 6.6; > 0 makes
      every upload the user's whole [N, d] delta plus its own noise (a
      sparse upload would reveal which rows it trained).
  """

  num_items: int
  ldp_noise_scale: float = 0.0

  distributor = distributors.Broadcast()
  keeps_table_on_clients = False

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

  def data_type_fields(self) -> dict:
    return {}

  def finalizer(self):
    return finalizers.ApplyDelta()

  def client_table_vectors(self, local_state, items):
    raise ValueError('The broadcast keeps no table on the clients.')

  def describe(self, num_users: int) -> dict:
    del num_users
    return {'kind': 'broadcast', 'ldp_noise_scale': self.ldp_noise_scale}

  def description(self, num_users: int) -> str:
    del num_users
    text = 'broadcast'
    if self.dense_upload:
      text += f', LDP lambda {self.ldp_noise_scale:g}'
    return text

  def round_bytes(self, spec, initial_parameters, metrics,
                  num_clients: int) -> RoundBytes:
    theta = dense_parameter_bytes(spec, initial_parameters) * num_clients
    download = parameter_bytes(initial_parameters, spec.global_keys) * (
        num_clients)
    if self.dense_upload:
      upload = theta + num_clients * parameter_bytes(
          initial_parameters, ['item_embedding']
      )
    else:
      uploaded_rows = metrics['aggregator']['item_embedding']['uploaded_rows']
      upload = theta + int(uploaded_rows) * (4 + 4 * spec.embedding_dim)
    return RoundBytes(upload, download, upload, download, download, download)


@dataclasses.dataclass(frozen=True)
class BroadcastOptions:
  """Options of a `BroadcastExchange`; `build` makes it for a model of
  `num_items` items (the other arguments are those every exchange's
  options take)."""

  ldp_noise_scale: float = 0.0

  def build(self, *, num_items: int, embedding_dim: int, seed: int,
            user_tiers=None) -> BroadcastExchange:
    del embedding_dim, seed, user_tiers
    return BroadcastExchange(num_items, ldp_noise_scale=self.ldp_noise_scale)
