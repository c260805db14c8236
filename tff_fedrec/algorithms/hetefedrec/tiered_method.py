"""HeteFedRec (Yuan et al., ICDE 2024) and the baselines of its Sec. V.C as
`method.Method`s.

Every user has a data tier (`RunData.user_tiers`: small, medium or large
by its amount of training data, `tiers`); a method maps each data tier to
the model tier it trains (`model_tier`) and says whether its uploads count
(`included`):

  build_hetefedrec          HeteFedRec (Algorithm 1); its config selects
                            Table IV's ablations.
  build_direct_aggregate    "Directly Aggregate": Eq. 8 without UDL, DDR
                            and RESKD.
  build_clustered           "Clustered FedRec": each tier aggregates only
                            its own.
  build_all_small / build_all_large   every client trains the small /
                            large model.
  build_all_large_exclusive large models everywhere, the uploads of the
                            small data tier dropped (those clients still
                            train their own user embedding).
  build_standalone          every client trains a whole model of its tier
                            alone (`standalone`): nothing is sent.

The driver: the store holds every user's private embedding and its Adam
state at the largest width (Standalone: one partition per tier of whole
models); a round groups users of one data tier per TFF client, and each
selected client holds out `validation_fraction` of its examples, drawn
every round (Sec. V.A); scores are each user's own model over all items
(Fed-LightGCN's user vector propagated on its training items).

Example:
  >>> method = build_hetefedrec(data=run_data, seed=0)
  >>> method.model_tier
  (0, 1, 2)
"""

import collections
import dataclasses
import statistics
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import client_state_store
from tff_fedrec import csr
from tff_fedrec import tier_optimizations
from tff_fedrec import tiers
from tff_fedrec.algorithms import method
from tff_fedrec.algorithms.hetefedrec import decorrelation
from tff_fedrec.algorithms.hetefedrec import models as hetero_models
from tff_fedrec.algorithms.hetefedrec import process as process_lib
from tff_fedrec.algorithms.hetefedrec import standalone
from tff_fedrec.templates import user_groups

# Sec. V.D: item embeddings of 8, 16 and 32; the paper's NCF scorer.
DEFAULT_WIDTHS = (8, 16, 32)
DEFAULT_HIDDEN_UNITS = (8, 8)
MODELS = ('ncf', 'lightgcn')


def held_out_examples(num_examples, fraction: float, rng) -> list:
  """Per user of the round, 1 for the examples it holds out to guide its
  local training (HeteFedRec Sec. V.A: 10% of a selected client's training
  data): ceil(fraction * n) of its n examples drawn at random, but never
  all of them, and none when `fraction` is 0."""
  masks = []
  for n in num_examples:
    mask = np.zeros([n], np.float32)
    if fraction:
      count = min(int(np.ceil(fraction * n)), n - 1)
      mask[rng.choice(n, size=count, replace=False)] = 1.0
    masks.append(mask)
  return masks


@dataclasses.dataclass(frozen=True)
class TieredMethod(method.Method):
  """A built tiered method (module docstring).

  Attributes:
    spec: The three tiers' model sizes.
    config: What a round does.
    initial_parameters: `hetero_models.initial_parameters`.
    process: The `process` or `standalone` process.
    data: The users it trains; `data.user_tiers` are their data tiers.
    seed: The run's seed (initial user embeddings, held-out draws).
    model_tier: The model tier a client of each data tier trains.
    included: Whether each data tier's uploads reach the server.
    personal_models: Whether every client trains a whole model of its own
      (`standalone`) instead of the public parameters.
    encodes_uploads: Whether each user's message is encoded by its tier
      (`process.build_client_work`'s `upload_codecs`), its data tier here:
      the device tier under `--device_tiers`.
  """

  spec: hetero_models.HeteroSpec
  config: process_lib.HeteroConfig
  initial_parameters: collections.OrderedDict
  process: tff.templates.IterativeProcess
  data: method.RunData
  seed: int = 0
  model_tier: tuple[int, int, int] = (0, 1, 2)
  included: tuple[bool, bool, bool] = (True, True, True)
  personal_models: bool = False
  encodes_uploads: bool = False

  @property
  def data_tier(self) -> np.ndarray:
    return np.asarray(self.data.user_tiers)

  def initial_store(self) -> client_state_store.ClientStateStore:
    """Every user's private embedding (zero beyond its model's width) and
    Adam state; Standalone: each tier's users' whole models."""
    spec = self.spec
    embeddings = hetero_models.initial_user_embeddings(
        spec, self.data.num_users, self.seed
    )
    if self.personal_models:
      partitions = []
      for tier in range(len(tiers.TIER_NAMES)):
        users = np.flatnonzero(self.data_tier == tier)
        partitions.append((users, standalone.initial_personal_models(
            spec, self.initial_parameters, tier=tier,
            user_embeddings=embeddings[users],
        )))
      return client_state_store.ClientStateStore.from_partitions(
          self.data.num_users, partitions
      )
    model_tier = np.asarray(self.model_tier)[self.data_tier]
    widths = np.asarray(spec.widths)[model_tier]
    embeddings[np.arange(spec.widths[-1])[None, :] >= widths[:, None]] = 0.0
    return client_state_store.ClientStateStore.from_partitions(
        self.data.num_users,
        [(np.arange(self.data.num_users), collections.OrderedDict(
            user=embeddings,
            adam_m=np.zeros_like(embeddings),
            adam_v=np.zeros_like(embeddings),
            adam_step=np.zeros([self.data.num_users], np.float32),
        ))],
    )

  def run_round(self, server_state, store, round_input, *,
                users_per_client: int = 1,
                cohort_size: Optional[int] = None) -> method.RoundResult:
    users = np.asarray(round_input.users)
    held_out = held_out_examples(
        [len(d['items']) for d in round_input.user_data],
        self.config.validation_fraction,
        np.random.default_rng([round_input.seed, round_input.round_num, 2]),
    )
    user_data = [
        collections.OrderedDict(
            items=d['items'], labels=d['labels'], validation=mask,
            seed=d['seed'],
        )
        for d, mask in zip(round_input.user_data, held_out)
    ]
    data_tier = self.data_tier[users]

    def group_data(positions):
      tier = int(data_tier[positions[0]])
      data = process_lib.group_client_data(
          [user_data[p] for p in positions],
          tier=self.model_tier[tier], include=self.included[tier],
      )
      if self.encodes_uploads:
        data['upload_tier'] = np.int32(tier)
      return data

    server_state, metrics = user_groups.run_round(
        self.process, server_state, store, users,
        sizes=[len(d['items']) for d in user_data],
        make_group_data=group_data, users_per_group=users_per_client,
        cohort_size=cohort_size,
        keys=data_tier,
    )
    client = metrics['client_work']
    record = {'train_loss': float(metrics['train_loss']),
              **method.tier_upload_figures(
                  client, self.data.tier_names or tiers.TIER_NAMES)}
    if 'kept_epoch_sum' in client:
      kept = np.float32(client['kept_epoch_sum'])
      trained = np.float32(client['trained_users'])
      record['mean_kept_epoch'] = float(kept / trained) if trained else 0.0
    distillation = metrics['finalizer'].get('distillation')
    if distillation is not None:
      record['distillation_loss_before'] = float(
          np.sum(distillation['loss_before']))
      record['distillation_loss_after'] = float(
          np.sum(distillation['loss_after']))
    per_client = self.bytes_per_client()
    clients = np.bincount(data_tier, minlength=len(tiers.TIER_NAMES))
    for direction in ('download', 'upload'):
      for tier, name in enumerate(tiers.TIER_NAMES):
        record[f'{direction}_bytes_{name}'] = (
            per_client[name][direction] * float(clients[tier]))
      record[f'{direction}_bytes'] = sum(
          record[f'{direction}_bytes_{name}'] for name in tiers.TIER_NAMES
      )
    return method.RoundResult(server_state=server_state, metrics=record)

  def user_model(self, server_state, store, data_tier: int, users):
    """The models `users` (all of `data_tier`) score with: (user vectors
    [U, N] as the scorer sees them, item table [I, N] or [U, I, N], score
    layers with or without a leading [U])."""
    users = np.asarray(users)
    train_offsets, train_items = csr.rows_of(
        self.data.train_offsets, self.data.train_items, users
    )
    if self.personal_models:
      models = tf.nest.map_structure(
          np.asarray, store.stacked_local_parameters(users)['model']
      )
      table, layers = models['item_table'], models['score_layers']
      user = models['user']
    else:
      params = server_state['global_parameters']
      tier = self.model_tier[data_tier]
      width = self.spec.widths[tier]
      table = np.asarray(params['item_tables'][tier])
      layers = tf.nest.map_structure(np.asarray, params['score_layers'][tier])
      user = np.asarray(store.stacked_local_parameters(users)['user'])[
          :, :width]
    return self._user_representation(
        user, table, train_offsets, train_items), table, layers

  def _user_representation(self, user, tables, train_offsets, train_items):
    """`hetero_models.user_representation` of `user` [U, N] on its local
    graph; `tables` [I, N] shared or [U, I, N] one per user."""
    owner = np.repeat(np.arange(user.shape[0]), np.diff(train_offsets))
    rows = tables[train_items] if tables.ndim == 2 else tables[
        owner, train_items
    ]
    neighbor_sum = np.zeros(user.shape, np.float32)
    np.add.at(neighbor_sum, owner, rows)
    return hetero_models.user_representation(
        self.spec, tf.constant(user), tf.constant(neighbor_sum),
        tf.constant(np.diff(train_offsets)),
    ).numpy()

  def score(self, server_state, store, examples: method.CandidateItems):
    """Each user's own model over every item (or the candidates)."""
    users = np.asarray(examples.users)
    candidates = examples.items
    scores = np.empty([users.size, self.data.num_items], np.float32)
    for tier in np.unique(self.data_tier[users]):
      rows = np.flatnonzero(self.data_tier[users] == tier)
      user, table, layers = self.user_model(
          server_state, store, int(tier), users[rows]
      )
      scores[rows] = hetero_models.score_all_items(
          tf.constant(user), tf.constant(table),
          tf.nest.map_structure(tf.constant, layers),
      ).numpy()
    if candidates is None:
      return scores
    return np.take_along_axis(scores, np.asarray(candidates), axis=1)

  def on_device_tiers(self) -> list[str]:
    """The model tiers some user trains (none for Standalone)."""
    if self.personal_models:
      return []
    return [tiers.TIER_NAMES[t] for t in sorted(set(self.model_tier))]

  def on_device_tier_model(self, server_state, store, tier):
    """A model tier's global model, evaluated on the users who train it
    with their (propagated) user vectors as input."""
    model_tier = tiers.TIER_NAMES.index(tier)
    users, vectors = [], []
    table = layers = None
    for data_tier in range(len(tiers.TIER_NAMES)):
      if self.model_tier[data_tier] != model_tier:
        continue
      tier_users = np.flatnonzero(self.data_tier == data_tier)
      if not tier_users.size:
        continue
      user, table, layers = self.user_model(
          server_state, store, data_tier, tier_users
      )
      users.append(tier_users)
      vectors.append(user)
    if table is None:
      raise ValueError(f'No user of the run trains the {tier} model.')
    return method.OnDeviceModel(
        tier=tier, user=None, architecture='neural_cf',
        split_first_layer=True,
        params=collections.OrderedDict(
            item_embedding=np.asarray(table),
            score_layers=tf.nest.map_structure(np.asarray, layers),
        ),
        eval_users=np.concatenate(users),
        eval_user_vectors=np.concatenate(vectors),
    )

  def on_device_user_model(self, server_state, store, user):
    data_tier = int(self.data_tier[user])
    vector, table, layers = self.user_model(
        server_state, store, data_tier, np.array([user])
    )
    if np.ndim(table) == 3:  # One model per user (Standalone).
      table = table[0]
      layers = tf.nest.map_structure(lambda leaf: leaf[0], layers)
    return method.OnDeviceModel(
        tier=tiers.TIER_NAMES[self.model_tier[data_tier]], user=user,
        architecture='neural_cf', split_first_layer=True,
        params=collections.OrderedDict(
            item_embedding=np.asarray(table),
            score_layers=tf.nest.map_structure(np.asarray, layers),
            user_embedding=np.asarray(vector[0], np.float32),
        ),
        eval_users=np.array([user]),
    )

  def bytes_per_client(self) -> dict:
    """Bytes one client of each data tier receives and sends per round
    (Table III): V_a plus the Theta_b it trains (b <= a with UDL), float32.
    Uploads are gradients of the same parameters. Clients that train models
    of their own (Standalone) send and receive nothing."""
    params = self.initial_parameters
    if self.personal_models:
      return {
          name: {'download': 0.0, 'upload': 0.0} for name in tiers.TIER_NAMES
      }
    result = {}
    for data_tier, name in enumerate(tiers.TIER_NAMES):
      tier = self.model_tier[data_tier]
      terms = range(tier + 1) if self.config.dual_task else (tier,)
      size = params['item_tables'][tier].nbytes + sum(
          leaf.nbytes
          for term in terms
          for leaf in tf.nest.flatten(params['score_layers'][term])
      )
      result[name] = {
          'download': float(size),
          'upload': float(size if self.included[data_tier] else 0),
      }
    return result

  def config_summary(self) -> dict:
    return {
        'method': dataclasses.asdict(self.config),
        'model': self.spec.model,
        'widths': list(self.spec.widths),
        'hidden_units': list(self.spec.hidden_units),
        'model_tier': list(self.model_tier),
        'included': list(self.included),
    }

  def description(self) -> str:
    sizes = tiers.tier_sizes(self.data_tier)
    return (f'tiers {"/".join(str(n) for n in sizes)} users, widths '
            f'{"/".join(str(w) for w in self.spec.widths)}, model tier of '
            f'each data tier {self.model_tier}.')

  def results_rows(self, summary):
    rows = [
        (f'  {name} client per round',
         f'{sent["download"] / 1024:.1f} KiB down, '
         f'{sent["upload"] / 1024:.1f} KiB up')
        for name, sent in summary['bytes_per_client'].items()
    ]
    if summary['singular_value_variance_large'] is not None:
      rows.append(('singular-value variance of V_l (Table V)',
                   f'{summary["singular_value_variance_large"]:.4g}'))
    return rows + method.tier_upload_rows(summary)

  def summary_fields(self, server_state, store, history):
    per_client = self.bytes_per_client()
    tier_sizes = tiers.tier_sizes(self.data_tier)
    # Local Adam: the epoch of 1..L a client kept, averaged over the rounds'
    # users (L without a validation split; 0 under server Adam).
    kept_epochs = [row['mean_kept_epoch'] for row in history
                   if 'mean_kept_epoch' in row]
    return {
        **method.tier_upload_summary(history),
        'bytes_per_client': per_client,
        # Measured: the mean over rounds of what each tier's clients moved.
        'bytes_per_round': {
            name: {
                direction: statistics.fmean(
                    row[f'{direction}_bytes_{name}'] for row in history
                )
                for direction in ('download', 'upload')
            }
            for name in tiers.TIER_NAMES
        },
        'tier_sizes': {
            name: int(tier_sizes[i]) for i, name in enumerate(tiers.TIER_NAMES)
        },
        'singular_value_variance_large': (
            None if self.personal_models
            else decorrelation.singular_value_variance(np.asarray(
                server_state['global_parameters']['item_tables'][-1]
            ))
        ),
        'mean_kept_epoch': (
            statistics.fmean(kept_epochs) if kept_epochs else None
        ),
    }


def model_spec(data: method.RunData, *, widths=DEFAULT_WIDTHS,
               hidden_units=DEFAULT_HIDDEN_UNITS, model: str = 'ncf',
               neighbor_gradient: bool = True) -> hetero_models.HeteroSpec:
  """The three tiers' models: Fed-NCF or Fed-LightGCN of `widths`."""
  if model not in MODELS:
    raise ValueError(
        f'Tiered methods take model ncf or lightgcn; got {model!r}.'
    )
  if not neighbor_gradient and model != 'lightgcn':
    raise ValueError(
        'neighbor_gradient=False applies to the lightgcn model only.'
    )
  return hetero_models.HeteroSpec(
      num_items=data.num_items, widths=tuple(widths),
      hidden_units=tuple(hidden_units) or DEFAULT_HIDDEN_UNITS,
      model=model, neighbor_gradient=neighbor_gradient,
  )


def _build(data, seed, spec_options, config, tier_optimization='none',
           **kwargs) -> TieredMethod:
  if data.user_tiers is None:
    raise ValueError('A tiered method needs the users\' tiers (RunData).')
  codecs = tier_optimizations.upload_codecs(tier_optimization,
                                            data.user_tiers)
  spec = model_spec(data, **spec_options)
  params = hetero_models.initial_parameters(spec, seed)
  return TieredMethod(
      spec=spec, config=config, initial_parameters=params,
      process=process_lib.build_hetefedrec_process(spec, params, config,
                                                   codecs),
      data=data, seed=seed, encodes_uploads=codecs is not None, **kwargs,
  )


def plain_config(config: process_lib.HeteroConfig,
                 **changes) -> process_lib.HeteroConfig:
  """`config` without UDL, DDR and RESKD (a plain FedRec per tier)."""
  return dataclasses.replace(
      config, dual_task=False, decorrelation_weight=0.0,
      distillation_items=0, **changes,
  )


def build_hetefedrec(*, data, seed=0, training=process_lib.HeteroConfig(),
                     tier_optimization='none', **spec_options) -> TieredMethod:
  """HeteFedRec (Algorithm 1); `training` selects Table IV's ablations;
  `spec_options` are `model_spec`'s (widths, hidden_units, model,
  neighbor_gradient)."""
  return _build(data, seed, spec_options, training,
                tier_optimization=tier_optimization)


def build_direct_aggregate(*, data, seed=0, training=process_lib.HeteroConfig(),
                           tier_optimization='none',
                           **spec_options) -> TieredMethod:
  """'Directly Aggregate' (Sec. V.C): Eq. 8 without UDL, DDR and RESKD."""
  return _build(data, seed, spec_options, plain_config(training),
                tier_optimization=tier_optimization)


def build_clustered(*, data, seed=0, training=process_lib.HeteroConfig(),
                    tier_optimization='none', **spec_options) -> TieredMethod:
  """'Clustered FedRec' (Sec. V.C): each tier aggregates only its own."""
  return _build(data, seed, spec_options,
                plain_config(training, aggregation='clustered'),
                tier_optimization=tier_optimization)


def build_all_small(*, data, seed=0, training=process_lib.HeteroConfig(),
                    tier_optimization='none', **spec_options) -> TieredMethod:
  """'All Small' (Sec. V.C): every client trains the small model."""
  return _build(data, seed, spec_options, plain_config(training),
                model_tier=(0, 0, 0),
                tier_optimization=tier_optimization)


def build_all_large(*, data, seed=0, training=process_lib.HeteroConfig(),
                    tier_optimization='none', **spec_options) -> TieredMethod:
  """'All Large' (Sec. V.C): every client trains the large model."""
  return _build(data, seed, spec_options, plain_config(training),
                model_tier=(2, 2, 2),
                tier_optimization=tier_optimization)


def build_all_large_exclusive(*, data, seed=0,
                              training=process_lib.HeteroConfig(),
                              tier_optimization='none',
                              **spec_options) -> TieredMethod:
  """'All Large/Exclusive' (Sec. V.C): large models everywhere, but the
  uploads of the clients with little data (the small data tier) are
  dropped; those clients still train their own user embedding."""
  return _build(data, seed, spec_options, plain_config(training),
                model_tier=(2, 2, 2), included=(False, True, True),
                tier_optimization=tier_optimization)


def build_standalone(*, data, seed=0, training=process_lib.HeteroConfig(),
                     **spec_options) -> TieredMethod:
  """'Standalone' (Sec. V.C): tier-sized models trained by each client
  alone (`training.learning_rate` is its Adam step)."""
  if training.update_rule != 'server_adam':
    raise ValueError(
        'update_rule local_adam does not apply to Standalone: its clients '
        'keep their whole model and Adam state on the device.'
    )
  if data.user_tiers is None:
    raise ValueError('A tiered method needs the users\' tiers (RunData).')
  spec = model_spec(data, **spec_options)
  return TieredMethod(
      spec=spec, config=plain_config(training),
      initial_parameters=hetero_models.initial_parameters(spec, seed),
      process=standalone.build_standalone_process(spec, training.learning_rate),
      data=data, seed=seed, personal_models=True,
  )
