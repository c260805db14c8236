"""Methods whose clients train their own item rows with local SGD.

PFedRec (Zhang et al., IJCAI 2023), FedMF, FedNCF and, through their
exchange, FedRAS and its compression baselines, and APFR-GKD through its
own client round, are one process: `composer.compose_client_state_process`
with

  distributor  the exchange's (`exchanges`): a broadcast of the global
               parameters, or FedRAS's compressed downlink;
  client work  `build_client_work`: ClientUpdate of PFedRec's Algorithm 1
               (`local_sgd.train_users_locally`, alternating with dual
               personalization, joint otherwise) on a compact table holding
               only the T rows of the items in the user's data (Sec. 4.3,
               "Efficient on-device update", `compact_tables`), so no
               client operation touches the whole [N, d] table. What a
               method changes in a client's round is its `ClientRound`
               role: where the parameters start (by default the download:
               the broadcast table or the client's own copy, the
               exchange's), its own loss term and what the user keeps;
  aggregator   `aggregators.keyed.KeyedFactory` of one factory per global
               parameter: the exchange's for `item_embedding`, a mean for
               the others, weighted by the users of each TFF client;
  finalizer    the exchange's (`finalizers.ApplyDelta`: global + the
               aggregated deltas, Algorithm 1, ServerExecute line 6).

One TFF client simulates a group of U users (`templates.user_groups`; U =
1 is one device per client): each user trains on its own copy of the
parameters and the group uploads the mean of its users' uploads with
weight U, so a round's result does not depend on the grouping.

Types (`composer` gives S and M):

  L = the users' client-local parameters (score function, user
      embedding), leading dim [U], plus the exchange's state (FedRAS:
      item_copy [U, N, d], synced_round [U]) and the client round's
  C = <local_parameters: L, personal_item_ids int32[U, K],
       personal_item_rows float32[U, K, d]> (K = 0 unless the users keep
       their trained rows; then the rows at D's `kept_rows`, all or those
       the protocol scores: `personal_rows.kept_rows`), what the program
       stores per user (`personal_rows`); only L goes into `next`: a round
       starts from the global item rows (Algorithm 1, ClientUpdate line
       1), so last round's fine-tuned rows are read only for inference
  D = `client_data_type(exchange, round_role)` (`compact_tables`)
  upload = <update=<item_embedding, the other global parameters>,
            weight=U, metrics=<loss_sum, num_examples, exchange's metrics>>
"""

import collections
import dataclasses
from collections.abc import Sequence
from typing import Optional, Protocol, runtime_checkable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import models
from tff_fedrec import tier_codecs
from tff_fedrec.aggregators import keyed
from tff_fedrec.algorithms.local_items import compact_tables
from tff_fedrec.algorithms.local_items import local_sgd
from tff_fedrec.templates import composer
from tff_fedrec.templates import roles
from tff_fedrec.templates import two_phase

UNTRAINED_ITEM_ROWS = ('round_start', 'aggregated')


@dataclasses.dataclass(frozen=True)
class ClientTrainingConfig:
  """Hyperparameters of the local training (PFedRec Sec. 6.2 defaults).

  Attributes:
    learning_rate: SGD step of user embeddings and dense layers.
    item_learning_rate: SGD step of item embedding rows; None means
      learning_rate * num_items * item_lr_eta, the reference code's rule
      (docs/methods/pfedrec.md), resolved for the model by `for_items`.
    item_lr_eta: eta of that rule (PFedRec's reference code: 80).
    user_learning_rate: SGD step of the user embedding; None means
      learning_rate (`local_sgd`).
    batch_size: Minibatch size B.
    local_epochs: Local epochs E.
    dual_personalization: Alternating updates and personal item rows (Sec
      4.2).
    untrained_item_rows: With dual personalization, which table scores the
      items a user did not fine-tune in its last round: 'round_start', the
      table it started that round from (the broadcast, or its own copy
      under a compressed exchange), as PFedRec's reference code evaluates
      the whole table a client kept; or 'aggregated', the server's table
      after the latest aggregation.
  """

  learning_rate: float = 0.1
  item_learning_rate: Optional[float] = None
  item_lr_eta: float = 80.0
  user_learning_rate: Optional[float] = None
  batch_size: int = 256
  local_epochs: int = 1
  dual_personalization: bool = True
  untrained_item_rows: str = 'round_start'

  def for_items(self, num_items: int) -> 'ClientTrainingConfig':
    """This configuration with `item_learning_rate` resolved for a table
    of `num_items` rows (given, or the rule of the attribute's docstring).

    Example: the defaults on ML-100K's 1,682 items give 0.1 x 1682 x 80 =
    13,456.
    """
    if self.item_learning_rate is not None:
      return self
    return dataclasses.replace(
        self,
        item_learning_rate=self.learning_rate * num_items * self.item_lr_eta,
    )

  def __post_init__(self):
    for name in ('batch_size', 'local_epochs'):
      if getattr(self, name) < 1:
        raise ValueError(f'{name} must be at least 1; got '
                         f'{getattr(self, name)}.')
    if self.untrained_item_rows not in UNTRAINED_ITEM_ROWS:
      raise ValueError(
          f'untrained_item_rows must be one of {UNTRAINED_ITEM_ROWS}; got '
          f'{self.untrained_item_rows!r}.'
      )


@runtime_checkable
class ClientRound(Protocol):
  """What a method changes in a client's round of the local-item client
  work (`DownloadRound` is PFedRec's; APFR-GKD brings its own).

  Attributes:
    keeps_trained_rows: Whether each user keeps the rows it trained as its
      personal rows (to be scored by).
    first_step_keys: With alternating updates, the parameters of each
      batch's first step (empty: the client-local ones, PFedRec's
      Algorithm 1).
  """

  keeps_trained_rows: bool
  first_step_keys: tuple[str, ...]

  def local_state(self, spec, params) -> collections.OrderedDict:
    """What it adds to one user's client-local state (numpy)."""

  def data_fields(self, embedding_dim: int) -> collections.OrderedDict:
    """The client data fields it adds, name -> TFF type."""

  def start(self, spec, broadcast, local, data, download):
    """TF: (the global parameters the users start from [U, ...], the
    exchange's kept state, client metrics); `download()` gives those of
    the download."""

  def loss_term(self, spec, broadcast, local, data,
                own) -> Optional[local_sgd.LossTerm]:
    """TF: the method's own term of the batch loss, or None; `own` holds
    the users' local parameters before the round."""

  def kept(self, spec, new_global, num_users) -> collections.OrderedDict:
    """TF: what it adds to the users' new local state."""


@dataclasses.dataclass(frozen=True)
class DownloadRound:
  """PFedRec's client round: start from the download (Algorithm 1,
  ClientUpdate line 1), the BCE alone, and keep the trained rows when
  `keeps_trained_rows` (dual personalization)."""

  keeps_trained_rows: bool = False
  first_step_keys: tuple[str, ...] = ()

  def local_state(self, spec, params) -> collections.OrderedDict:
    del spec, params
    return collections.OrderedDict()

  def data_fields(self, embedding_dim: int) -> collections.OrderedDict:
    del embedding_dim
    return collections.OrderedDict()

  def start(self, spec, broadcast, local, data, download):
    del spec, broadcast, local, data
    return download()

  def loss_term(self, spec, broadcast, local, data, own):
    del spec, broadcast, local, data, own
    return None

  def kept(self, spec, new_global, num_users) -> collections.OrderedDict:
    del spec, new_global, num_users
    return collections.OrderedDict()


def download_round(training: ClientTrainingConfig) -> DownloadRound:
  """PFedRec's client round under `training`: with dual personalization
  the users keep the rows they fine-tuned."""
  return DownloadRound(keeps_trained_rows=training.dual_personalization)


def client_data_type(exchange, client_round: ClientRound = DownloadRound(),
                     embedding_dim: Optional[int] = None,
                     encodes_uploads: bool = False
                     ) -> collections.OrderedDict:
  """D: the data of one TFF client's group of U users (`compact_tables`),
  with the exchange's per-user fields (bandwidth e_u), the client round's
  and, when the uploads are encoded by device tier, each user's tier
  (`tier` int32 [U])."""
  data_type = compact_tables.data_type()
  if client_round.keeps_trained_rows:
    # Which of its trained rows each user keeps (`personal_rows.kept_rows`).
    data_type['kept_rows'] = tff.TensorType(np.int32, [None, None])
    data_type['num_kept_rows'] = tff.TensorType(np.int32, [None])
  data_type.update(exchange.data_type_fields())
  if encodes_uploads:
    data_type['tier'] = tff.TensorType(np.int32, [None])
  data_type.update(client_round.data_fields(embedding_dim))
  return data_type


def type_of(structure, leading=()) -> tff.Type:
  """The TFF type of numpy `structure`, each leaf with `leading` dims."""
  return tff.to_type(tf.nest.map_structure(
      lambda leaf: tff.TensorType(
          np.asarray(leaf).dtype.type, [*leading, *np.shape(leaf)]
      ),
      structure,
  ))


def dense_keys(spec: models.RecommenderSpec) -> tuple[str, ...]:
  """The global parameters other than the item table (theta)."""
  return tuple(k for k in spec.global_keys if k != 'item_embedding')


def initial_local_state(
    spec: models.RecommenderSpec, params: models.Parameters, exchange,
    client_round: ClientRound = DownloadRound(),
) -> collections.OrderedDict:
  """One user's L before its first round (numpy): the server's initial
  local parameters, as in the reference code (Algorithm 1, ServerExecute
  line 1), the exchange's state and the client round's."""
  _, local_params = models.split_parameters(spec, params)
  state = collections.OrderedDict(local_params)
  state.update(exchange.local_state(params['item_embedding']))
  state.update(client_round.local_state(spec, params))
  return state


def initial_client_state(
    spec: models.RecommenderSpec, params: models.Parameters, exchange,
    client_round: ClientRound = DownloadRound(),
) -> collections.OrderedDict:
  """C of a user that has not trained yet: L and no personal rows."""
  return collections.OrderedDict(
      local_parameters=initial_local_state(spec, params, exchange,
                                           client_round),
      personal_item_ids=np.zeros([0], np.int32),
      personal_item_rows=np.zeros([0, spec.embedding_dim], np.float32),
  )


def build_client_work(
    spec: models.RecommenderSpec,
    initial_params: models.Parameters,
    training: ClientTrainingConfig,
    exchange,
    broadcast_type: tff.Type,
    client_round: ClientRound = DownloadRound(),
    upload_codecs: Optional[Sequence[tier_codecs.UpdateCodec]] = None,
) -> roles.ClientWork:
  """The client work of the module docstring; with `upload_codecs` (one
  per device tier) each user's upload is its trained parameters as the
  server decodes them (`encode_upload`)."""
  training = training.for_items(spec.num_items)
  theta_keys = dense_keys(spec)
  local_type = type_of(
      initial_local_state(spec, initial_params, exchange, client_round),
      leading=[None],
  )
  data_type = tff.to_type(client_data_type(
      exchange, client_round, spec.embedding_dim,
      encodes_uploads=upload_codecs is not None))

  @tff.tensorflow.computation(broadcast_type, local_type, data_type)
  def client_update(broadcast, local, data):
    num_users = tf.shape(data['num_examples'])[0]

    def download():
      per_user = lambda v: tf.repeat(tf.expand_dims(v, 0), num_users, axis=0)
      global_params = broadcast['global_parameters']
      start = tf.nest.map_structure(
          per_user,
          collections.OrderedDict((k, global_params[k]) for k in theta_keys),
      )
      start['item_embedding'], kept, metrics = exchange.start_rows(
          broadcast, local, data
      )
      return start, kept, metrics

    start, kept, exchange_metrics = client_round.start(
        spec, broadcast, local, data, download)
    own = collections.OrderedDict((k, local[k]) for k in spec.local_keys)
    result = local_sgd.train_users_locally(
        spec,
        models.merge_parameters(spec, start, own),
        data['items'],
        data['labels'],
        data['num_examples'],
        batch_size=training.batch_size,
        local_epochs=training.local_epochs,
        learning_rate=training.learning_rate,
        item_learning_rate=training.item_learning_rate,
        alternating=training.dual_personalization,
        shuffle_seeds=data['seeds'],
        item_gradient_maps=exchange.gradient_maps(
            data, broadcast['round_num'], spec.embedding_dim
        ),
        loss_term=client_round.loss_term(spec, broadcast, local, data, own),
        first_keys=client_round.first_step_keys or None,
        user_learning_rate=training.user_learning_rate,
    )
    new_global, new_local = models.split_parameters(spec, result.parameters)
    trained_rows = new_global['item_embedding']
    uploaded, codec_metrics = new_global, {}
    if upload_codecs is not None:
      uploaded, codec_metrics = encode_upload(
          upload_codecs, start, new_global, data)
    update = collections.OrderedDict(
        item_embedding=exchange.item_upload(
            data, start['item_embedding'], uploaded['item_embedding'],
            broadcast['round_num'],
        )
    )
    for key in theta_keys:
      update[key] = tf.nest.map_structure(
          lambda new, old: tf.reduce_mean(new - old, axis=0),
          uploaded[key], start[key],
      )
    if client_round.keeps_trained_rows:
      # Only the rows the program keeps leave the worker.
      personal_ids = tf.gather(data['row_ids'], data['kept_rows'],
                               batch_dims=1)
      personal_rows = tf.gather(trained_rows, data['kept_rows'],
                                batch_dims=1)
    else:
      personal_ids = tf.zeros([num_users, 0], tf.int32)
      personal_rows = tf.zeros([num_users, 0, spec.embedding_dim], tf.float32)
    new_local.update(kept)
    new_local.update(client_round.kept(spec, new_global, num_users))
    new_state = collections.OrderedDict(
        local_parameters=new_local,
        personal_item_ids=personal_ids,
        personal_item_rows=personal_rows,
    )
    return new_state, roles.upload(
        update, users=num_users, loss_sum=result.loss_sum,
        num_examples=result.num_examples, **exchange_metrics,
        **codec_metrics,
    )

  return roles.client_work(client_update)


def encode_upload(codecs: Sequence[tier_codecs.UpdateCodec], start,
                  trained, data):
  """TF: each user's trained global parameters as the server decodes its
  message (RF² Sec. 5.2: start + decode(encode(trained - start)) by its
  tier's codec, `tier_codecs.encode_message`, tensor by tensor: the deltas
  of its num_rows real item rows [n_u, d], then each dense parameter), and
  the round's figures `tier_upload_bytes` (the messages' bytes) /
  `tier_users`, float32 [tiers].

  `start`, `trained`: nests of float32 [U, ...] of the same keys; `data`
  has `tier` [U], `seeds` [U, 2] and the compact table's `num_rows` [U].
  A user's padded rows past num_rows are not part of its message; they
  stay untrained."""
  deltas = collections.OrderedDict(
      (key, tf.nest.map_structure(lambda new, old: new - old, trained[key],
                                  start[key]))
      for key in trained)
  seeds = tier_codecs.message_seeds(data['seeds'])
  decoded, sizes = tier_codecs.encode_users(
      codecs, deltas, data['tier'], seeds,
      row_counts={'item_embedding': data['num_rows']})
  uploaded = collections.OrderedDict(
      (key, tf.nest.map_structure(lambda old, d: old + d, start[key],
                                  decoded[key]))
      for key in trained)
  tiers = len(codecs)
  return uploaded, collections.OrderedDict(
      tier_upload_bytes=tf.math.unsorted_segment_sum(sizes, data['tier'],
                                                     tiers),
      tier_users=tf.math.unsorted_segment_sum(tf.ones_like(sizes),
                                              data['tier'], tiers))


def build_process(
    spec: models.RecommenderSpec,
    initial_params: models.Parameters,
    training: ClientTrainingConfig,
    exchange,
    *,
    client_round: Optional[ClientRound] = None,
    item_aggregator: Optional[object] = None,
    model_aggregator: Optional[
        tff.aggregators.WeightedAggregationFactory] = None,
    distributor: Optional[roles.Distributor] = None,
    finalizer: Optional[roles.Finalizer] = None,
    upload_codecs: Optional[Sequence[tier_codecs.UpdateCodec]] = None,
) -> two_phase.TwoPhaseProcess:
  """Builds the process of the module docstring.

  Args:
    spec: The model and its global / local declaration.
    initial_params: Initial parameters (`models.initial_parameters`).
    training: Local training hyperparameters.
    exchange: An `exchanges.Exchange`.
    client_round: The method's `ClientRound`; None means PFedRec's
      (`download_round`).
    item_aggregator: Aggregates the item uploads (the exchange's
      `item_upload_type`); None means the exchange's `item_factory()`.
    model_aggregator: Aggregates the deltas of each other global parameter
      (FedNCF's shared MLP), weighted by users; None means
      `tff.aggregators.MeanFactory()`.
    distributor: None means the exchange's.
    finalizer: None means the exchange's.
    upload_codecs: Per device tier, how a user's upload is encoded (RF²'s
      Prune / Quant / QuantS, `tier_codecs`); None: sent as it is.
  """
  training = training.for_items(spec.num_items)
  client_round = client_round or download_round(training)
  global_init, _ = models.split_parameters(spec, initial_params)

  @tff.tensorflow.computation
  def initial_global_parameters():
    return tf.nest.map_structure(tf.constant, global_init)

  inner = collections.OrderedDict(
      item_embedding=item_aggregator or exchange.item_factory()
  )
  update_type = collections.OrderedDict(
      item_embedding=exchange.item_upload_type(spec.embedding_dim)
  )
  for key in dense_keys(spec):
    inner[key] = model_aggregator or tff.aggregators.MeanFactory()
    update_type[key] = type_of(global_init[key])
  distributor = distributor or exchange.distributor
  broadcast_type = distributor.received_type(
      initial_global_parameters.type_signature.result
  )
  return composer.compose_client_state_process(
      initial_global_parameters=initial_global_parameters,
      distributor=distributor,
      client_work=build_client_work(
          spec, initial_params, training, exchange, broadcast_type,
          client_round, upload_codecs,
      ),
      aggregator=keyed.KeyedFactory(inner).create(
          tff.to_type(update_type), tff.TensorType(np.float32)
      ),
      finalizer=finalizer or exchange.finalizer(),
  )
