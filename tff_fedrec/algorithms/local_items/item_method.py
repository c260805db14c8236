"""The `method.Method` of every local-item-training method.

PFedRec, FedMF, FedNCF, FedRAS and its baselines, and APFR-GKD differ in
their model (`models.RecommenderSpec`), local training, exchange
(`exchanges`) and client round (`client_training.ClientRound`); their
process is `client_training.build_process` and their driver this one:

  store    `personal_rows.PersonalRowsStore`: each user's local parameters
           (and the exchange's state: FedRAS's item-table copy) and, when
           it keeps them, the item rows it fine-tuned;
  round    the users grouped U per TFF client (`templates.user_groups`),
           each group's data its compact tables (`compact_tables`) with
           the exchange's per-user fields (bandwidth e_u) and the method's
           (`group_data_fields`);
  bytes    the exchange's accounting, every round;
  scores   each user's own model: its local parameters, its fine-tuned
           rows where it has them, and the server's global parameters
           (`item_scoring.score_candidates`), as PFedRec's reference code
           evaluates `client_model_params[user]`: with dual
           personalization the items a user did not fine-tune are scored
           by the table it started its last round from (the broadcast,
           recorded in the store, or its own copy under an exchange that
           keeps one; `training.untrained_item_rows`); FedRAS scores with
           the server's Q and theta and each p_u. A method scores
           otherwise through `_start_vectors` and `_score_layers`
           (APFR-GKD: each user's own trained model).

Example:
  >>> method = build_method(spec, training, exchanges.BroadcastOptions(),
  ...                       data=run_data, seed=0)
  >>> method.spec.local_keys
"""

import collections
import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import models
from tff_fedrec import tier_optimizations
from tff_fedrec import tiers
from tff_fedrec.algorithms import method
from tff_fedrec.algorithms.local_items import client_training
from tff_fedrec.algorithms.local_items import compact_tables
from tff_fedrec.algorithms.local_items import item_scoring
from tff_fedrec.algorithms.local_items import personal_rows
from tff_fedrec.templates import user_groups


SINGLE_TIER = 'single'


def _numpy(structure):
  return tf.nest.map_structure(np.asarray, structure)


def on_device_tier_model(
    spec: models.RecommenderSpec, global_params, initial_parameters, store,
) -> method.OnDeviceModel:
  """The global model a new phone downloads: the aggregated item table and
  the global score layers (PFedRec, whose score function is personal: the
  initial one, where a new device starts); it takes the user's own
  embedding as input where the model has one."""
  global_params = _numpy(global_params)
  params = collections.OrderedDict(
      item_embedding=global_params['item_embedding']
  )
  if spec.has_score_layers:
    source = (global_params if 'score_layers' in spec.global_keys
              else initial_parameters)
    params['score_layers'] = _numpy(source['score_layers'])
  users = np.arange(store.num_users)
  vectors = None
  if spec.has_user_embedding:
    vectors = np.asarray(
        store.stacked_local_parameters(users)['user_embedding'], np.float32
    )
  return method.OnDeviceModel(
      tier=SINGLE_TIER, user=None, architecture=spec.architecture,
      params=params, eval_users=users, eval_user_vectors=vectors,
  )


def on_device_user_model(
    spec: models.RecommenderSpec, global_params, store, user: int,
    item_table: np.ndarray, trained_layers=None,
) -> method.OnDeviceModel:
  """User `user`'s model: its item table `item_table` [N, d] (its
  fine-tuned rows over the table it scores the others with), its score
  layers (`trained_layers` [1, ...] if the method scores the user with
  layers of its own, else its local or the global ones) and user
  embedding."""
  global_params = _numpy(global_params)
  local = tf.nest.map_structure(
      lambda leaf: np.asarray(leaf)[0],
      store.stacked_local_parameters(np.array([user])),
  )
  params = collections.OrderedDict(item_embedding=np.asarray(item_table))
  if trained_layers is not None:
    params['score_layers'] = tf.nest.map_structure(
        lambda leaf: leaf[0], trained_layers)
  elif spec.has_score_layers:
    source = local if 'score_layers' in spec.local_keys else global_params
    params['score_layers'] = _numpy(source['score_layers'])
  if spec.has_user_embedding:
    params['user_embedding'] = np.asarray(local['user_embedding'], np.float32)
  return method.OnDeviceModel(
      tier=SINGLE_TIER, user=user, architecture=spec.architecture,
      params=params, eval_users=np.array([user]),
  )


class ItemTableMethod(method.Method):
  """What every method whose users score with the global item table, their
  fine-tuned rows and their local parameters shares (`LocalItemMethod`,
  `fedrecon.ReconstructionMethod`): scores, the bytes summary and the
  on-device models. A subclass has `spec`, `initial_parameters` and
  `global_parameters(server_state)`."""

  spec: models.RecommenderSpec
  initial_parameters: models.Parameters

  def global_parameters(self, server_state):
    return server_state['global_parameters']

  def user_item_vectors(self, server_state, store, users, items):
    """Each of `users`' item vectors for `items` [U, C]: [U, C, d]."""
    table = np.asarray(self.global_parameters(server_state)['item_embedding'])
    return store.item_vectors(
        users, items, table,
        start_vectors=self._start_vectors(store, users, items, table),
    )

  def _start_vectors(self, store, users, items,
                     global_table) -> Optional[np.ndarray]:
    """The rows under users' personal rows if the method keeps them itself
    ([U, C, d]); None: the store's recorded start tables, else the global
    table `global_table` [N, d]."""
    del store, users, items, global_table
    return None

  def _score_layers(self, local, global_params):
    """The score layers users of local state `local` (leading [U]) are
    scored with, if the method keeps layers of their own beside the
    declared ones ([U, ...]); None: their local or the global layers, as
    the spec declares them."""
    del local, global_params
    return None

  def score(self, server_state, store, examples: method.CandidateItems):
    users = np.asarray(examples.users)
    candidates = examples.items
    if candidates is None:
      candidates = np.broadcast_to(
          np.arange(self.spec.num_items), [users.size, self.spec.num_items]
      )
    return item_scoring.score_candidates(
        self.spec, self.global_parameters(server_state), store,
        np.asarray(candidates), users=users,
        item_vectors=lambda u, i: self.user_item_vectors(
            server_state, store, u, i),
        score_layers=self._score_layers,
    )

  def summary_fields(self, server_state, store, history):
    del server_state
    return {**method.bytes_summary(history, store),
            **method.downlink_summary(history),
            **method.tier_upload_summary(history)}

  def results_rows(self, summary):
    return method.bytes_rows(summary) + method.tier_upload_rows(summary)

  def on_device_tiers(self) -> list[str]:
    return [SINGLE_TIER]

  def on_device_tier_model(self, server_state, store, tier):
    del tier  # One size.
    return on_device_tier_model(
        self.spec, self.global_parameters(server_state),
        self.initial_parameters, store,
    )

  def on_device_user_model(self, server_state, store, user):
    if not store.has_whole_rows([user])[0]:
      raise ValueError(
          f'User index {user} holds only the fine-tuned item rows the '
          'protocol scores it on: a user keeps all of them in its last '
          'round of the run, and this checkpoint is from before it. Train '
          'the run to its last round (run train again with the same '
          '--root_dir and --rounds) before exporting per-user models.'
      )
    global_params = _numpy(self.global_parameters(server_state))
    return on_device_user_model(
        self.spec, global_params, store, user,
        item_table=self.user_item_vectors(
            server_state, store, np.array([user]),
            np.arange(self.spec.num_items)[None],
        )[0],
        trained_layers=self._score_layers(
            tf.nest.map_structure(
                np.asarray, store.stacked_local_parameters(np.array([user]))),
            global_params),
    )


@dataclasses.dataclass(frozen=True)
class LocalItemMethod(ItemTableMethod):
  """A local-item-training method (module docstring).

  Attributes:
    spec: The model and which of its parameters are global / client-local.
    training: The local training.
    exchange: The `exchanges.Exchange`.
    initial_parameters: Initial values of all parameters (numpy).
    process: `client_training.build_process`'s process.
    num_users: The users of the store.
    client_round: The method's `client_training.ClientRound`.
    scored_items: `method.RunData.scored_items`: with it, a user keeps
      between rounds only the fine-tuned rows it is scored by, and all of
      them in its last round of the run (`personal_rows.kept_rows`,
      `method.RoundInput.last_round_users`).
    upload_tiers: int32 [U], each user's device tier, when its uploads are
      encoded by tier (`client_training.encode_upload`); None otherwise.
    tier_names: The names of those tiers.
  """

  spec: models.RecommenderSpec
  training: client_training.ClientTrainingConfig
  exchange: object
  initial_parameters: models.Parameters
  process: tff.templates.IterativeProcess
  num_users: int
  client_round: client_training.ClientRound
  scored_items: Optional[tuple[np.ndarray, np.ndarray]] = None
  upload_tiers: Optional[np.ndarray] = None
  tier_names: tuple[str, ...] = ()

  @property
  def initial_client_state(self):
    return client_training.initial_client_state(
        self.spec, self.initial_parameters, self.exchange, self.client_round
    )

  def initial_store(self) -> personal_rows.PersonalRowsStore:
    return personal_rows.PersonalRowsStore(
        self.num_users, self.initial_client_state)

  @property
  def scores_untrained_rows_from_round_start(self) -> bool:
    """Whether a user's rows it did not fine-tune are scored by the table
    it started its last round from (it keeps trained rows and
    `untrained_item_rows='round_start'`), rather than the global one."""
    return (self.client_round.keeps_trained_rows
            and self.training.untrained_item_rows == 'round_start')

  @property
  def records_start_tables(self) -> bool:
    """Whether the store records the table each user starts its round
    from: the round-start rows score, and the exchange keeps no copy of
    the table on the clients."""
    return (self.scores_untrained_rows_from_round_start
            and not self.exchange.keeps_table_on_clients)

  def _start_vectors(self, store, users, items, global_table):
    if (self.scores_untrained_rows_from_round_start
        and self.exchange.keeps_table_on_clients):
      return self.exchange.client_table_vectors(
          store.stacked_local_parameters(users), items)
    return None

  def group_data_fields(self, store, users, data) -> dict:
    """The method's own client data of a group of `users` (beside its
    compact tables `data` and the exchange's fields), e.g. rows the store
    keeps for it; none by default."""
    del store, users, data
    return {}

  def run_round(self, server_state, store, round_input, *,
                users_per_client: int = 1,
                cohort_size: Optional[int] = None) -> method.RoundResult:
    server_state, metrics = self.run_exchange(
        self.process, server_state, store, round_input,
        users_per_client=users_per_client, cohort_size=cohort_size,
    )
    return method.RoundResult(server_state=server_state, metrics=metrics)

  def run_exchange(self, process, server_state, store, round_input, *,
                   users_per_client: int = 1, observe_uploads=None,
                   cohort_size: Optional[int] = None):
    """One download, training and upload of the round's users through
    `process` (this method's, or one of the same server state: APFR-GKD
    runs two a round); returns (server state, the figures of
    `RoundResult.metrics`). `observe_uploads` and `cohort_size` as in
    `user_groups.run_round`."""
    users = np.asarray(round_input.users)
    fields = self.exchange.client_fields(users)
    if self.records_start_tables:
      store.record_start_table(
          users, round_input.round_num,
          self.global_parameters(server_state)['item_embedding'],
      )

    kept_items = self._kept_items(store, round_input)

    def group_data(positions):
      data = compact_tables.group_client_data(
          [round_input.user_data[p] for p in positions]
      )
      if self.client_round.keeps_trained_rows:
        data.update(personal_rows.kept_rows(
            data['row_ids'], data['num_rows'],
            [kept_items(p) for p in positions]))
      for key, values in fields.items():
        data[key] = values[positions]
      if self.upload_tiers is not None:
        data['tier'] = self.upload_tiers[users[positions]].astype(np.int32)
      data.update(self.group_data_fields(store, users[positions], data))
      return data

    server_state, metrics = user_groups.run_round(
        process, server_state, store, users,
        sizes=[len(d['items']) for d in round_input.user_data],
        make_group_data=group_data, users_per_group=users_per_client,
        cohort_size=cohort_size,
        observe_uploads=observe_uploads,
    )
    sent = self.exchange.round_bytes(
        self.spec, self.initial_parameters, metrics, len(users)
    )
    return server_state, {
        'train_loss': float(metrics['train_loss']),
        **{key: float(value) for key, value in sent._asdict().items()},
        **method.tier_upload_figures(metrics['client_work'],
                                     self.tier_names),
        # The encoded downlink's own figures (FedRAS: group_count,
        # mean_cosine, similarity_at_expected), for the next round.
        **{f'downlink_{key}': float(value)
           for key, value in metrics['distributor'].items()},
    }

  def _kept_items(self, store, round_input):
    """The items whose fine-tuned rows the round's user at a position
    keeps: its scored items (ascending), or None for all, in its last
    round of the run or when the protocol may score any item or the store
    trains from the rows."""
    last = round_input.last_round_users
    if (self.scored_items is None or last is None
        or store.trains_from_rows):
      return lambda position: None
    offsets, items = self.scored_items
    users = np.asarray(round_input.users)

    def kept_items(position):
      if last[position]:
        return None
      user = users[position]
      return items[offsets[user] : offsets[user + 1]]

    return kept_items

  def config_summary(self) -> dict:
    return {
        'training': dataclasses.asdict(self.training),
        'embedding_dim': self.spec.embedding_dim,
        'hidden_units': list(self.spec.hidden_units),
        'exchange': self.exchange.describe(self.num_users),
    }

  def description(self) -> str:
    return (f'item learning rate {self.training.item_learning_rate:g}; '
            f'exchange: {self.exchange.description(self.num_users)}.')


def build_method(
    spec: models.RecommenderSpec,
    training: client_training.ClientTrainingConfig,
    exchange,
    *,
    data: method.RunData,
    seed: int,
    item_aggregator: Optional[object] = None,
    model_aggregator: Optional[object] = None,
    tier_optimization: str = 'none',
) -> LocalItemMethod:
  """A `LocalItemMethod` of `spec` with initial parameters seeded by
  `seed`; `exchange` is an exchange's options (`exchanges.BroadcastOptions`,
  `fedras.exchange.FedRASOptions`, ...), built for `spec` and `data`;
  `tier_optimization` (`tier_optimizations`) may encode each user's upload
  by its device tier (`client_training.encode_upload`)."""
  codecs = tier_optimizations.upload_codecs(tier_optimization,
                                            data.user_tiers)
  exchange = exchange.build(
      num_items=spec.num_items, embedding_dim=spec.embedding_dim, seed=seed,
      user_tiers=data.user_tiers,
  )
  training = training.for_items(spec.num_items)
  if training.user_learning_rate is not None and not spec.has_user_embedding:
    raise ValueError(
        f'The {spec.architecture} model has no user embedding; drop '
        '--user_learning_rate.'
    )
  client_round = client_training.download_round(training)
  params = models.initial_parameters(spec, seed)
  return LocalItemMethod(
      spec=spec,
      training=training,
      exchange=exchange,
      initial_parameters=params,
      process=client_training.build_process(
          spec, params, training, exchange, client_round=client_round,
          item_aggregator=item_aggregator, model_aggregator=model_aggregator,
          upload_codecs=codecs,
      ),
      num_users=data.num_users,
      client_round=client_round,
      scored_items=data.scored_items,
      **tier_upload_fields(codecs, data),
  )


def tier_upload_fields(codecs, data: method.RunData) -> dict:
  """`LocalItemMethod`'s upload_tiers and tier_names when `codecs`
  encode the uploads by tier, else {}."""
  if codecs is None:
    return {}
  return {'upload_tiers': np.asarray(data.user_tiers, np.int32),
          'tier_names': tuple(data.tier_names or tiers.TIER_NAMES)}
