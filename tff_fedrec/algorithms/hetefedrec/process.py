"""HeteFedRec (Yuan et al., ICDE 2024) and its baselines as one TFF process.

Clients belong to a tier a in (small, medium, large) and train a model of
their tier's size: item table V_a [I, N_a], scorer Theta_a, private user
embedding u_i [N_a] (`hetero_models`). Algorithm 1, one round:

  clients (`dual_task.client_gradients`): one gradient of L'_a
    (Eq. 11 unified dual-task learning + Eq. 14 decorrelation) on all their
    data; u_i takes a gradient step on the device (Eq. 3; or Adam); the
    gradients of V_a and of Theta_b (b <= a) are uploaded.
  server: padding-aware sums of the V gradients (Eq. 7-8,
    `aggregators.padded_sum.PaddedSumFactory`: small and medium slices
    include the large clients' first dimensions), sums of each Theta_b's
    gradients (Eq. 15), an Adam step on every public parameter (Eq. 9, 15;
    Adam with lr 0.001, Sec. V.D), then relation-based ensemble
    self-distillation on a random item subset (Eq. 16-17,
    `distillation.ensemble_distillation`).

With `HeteroConfig.update_rule='local_adam'` Adam runs on the clients
instead (Sec. III.A's local training): each client trains L epochs (one
full-batch step each, or minibatches of `local_batch_size`) from fresh
moments and uploads its change d_i = x_0 - x_L
(`dual_task.local_adam_changes`); the server's step is
x <- x - sum_i d_i (Eq. 4, 9, 15), then the same distillation. Two more
options of that rule: `validation_fraction` holds out part of each client's
examples to pick its best local epoch (Sec. V.A), and
`change_aggregation='mean'` averages each coordinate's changes over the
clients that trained it instead of summing them, and 'fedavg' over every
client of the round that holds it (FedAvg [10] of whole models).

The baselines of Sec. V.C are the same process with parts switched off
(`HeteroConfig`): "directly aggregate" is Eq. 8 without UDL, DDR and RESKD;
"clustered" sums each tier's uploads into its own tables only; "all small" /
"all large" put every client in one tier; "all large / exclusive" drops the
uploads of the clients with little data (their `include` flag is 0).

The process is `composer.compose_client_state_process` of

  distributor  `distributors.Broadcast` of <item_tables, score_layers>;
  client work  `build_client_work`: each TFF client is a group of U users
               of one tier (`templates.user_groups`), switching on the tier;
  aggregator   `TierChangesFactory`: padding-aware sums (or per-tier sums
               for 'clustered') of the tables, sums of each Theta_b, and
               under change_aggregation 'mean' / 'fedavg' their means;
  finalizer    `finalizers.ServerAdam` or `finalizers.SubtractChanges`,
               wrapped in `reskd.WithEnsembleDistillation` (RESKD)
               unless distillation_items is 0.

Types (`composer` gives S and M):

  L = <user [U, N_l], adam_m [U, N_l], adam_v [U, N_l], adam_step [U]>: the
      users' private embeddings and their Adam state, stored at the largest
      width (a tier-a user uses its first N_a entries; the rest stay 0)
  D = `client_data_type()`
  upload = <update=<tables, score_layers, [row_counts, layer_counts]>,
            weight=U, metrics=<loss_sum, num_examples, kept_epoch_sum,
            trained_users>>; the counts, under change_aggregation 'mean' or
            'fedavg', are the divisors of the means (row_counts [I, 3], or
            [3] under 'fedavg', where every row has the same count;
            layer_counts [3]); a real client's sparse upload of its rows
            carries the row counts, so bytes do not add them. The mean kept
            epoch of the round's training users is kept_epoch_sum /
            trained_users (L without a validation split; 0 under
            'server_adam').
"""

import collections
from collections.abc import Sequence
import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import adam
from tff_fedrec import tier_codecs
from tff_fedrec.aggregators import padded_sum
from tff_fedrec.algorithms.hetefedrec import dual_task
from tff_fedrec.algorithms.hetefedrec import models as hetero_models
from tff_fedrec.algorithms.hetefedrec import reskd
from tff_fedrec.algorithms.local_items import compact_tables
from tff_fedrec.templates import composer
from tff_fedrec.templates import distributors
from tff_fedrec.templates import finalizers
from tff_fedrec.templates import roles
from tff_fedrec.templates import two_phase
from tff_fedrec.templates import user_groups

AGGREGATIONS = ('padded', 'clustered')
USER_OPTIMIZERS = ('sgd', 'adam')
UPDATE_RULES = ('server_adam', 'local_adam')
CHANGE_AGGREGATIONS = ('sum', 'mean', 'fedavg')


@dataclasses.dataclass(frozen=True)
class HeteroConfig:
  """What a round does (HeteFedRec Sec. IV, V.D and Table IV's ablations).

  Attributes:
    learning_rate: Adam's step for every public parameter (on the server,
      or on each client with update_rule 'local_adam'). Sec. V.D says
      0.001; with Algorithm 1's one gradient per round that leaves every
      method of Table II a popularity ranker after 480 rounds on ML-1M,
      while 0.01 learns beyond it (docs/results/hetefedrec.md), hence the default.
    dual_task: Unified dual-task learning (UDL, Eq. 11).
    decorrelation_weight: alpha of Eq. 14 (DDR); 0 turns DDR off. The paper
      sweeps 0.5 to 2.0 (Fig. 8) without naming its choice.
    distillation_items: |V_kd| of Eq. 16; 0 turns RESKD off.
    distillation_learning_rate: Step of Eq. 17's loss, Adam-like: every
      distilled coordinate moves by this much (`reskd`, step_rule
      'adam').
    aggregation: 'padded' (Eq. 8) or 'clustered' (each tier alone).
    user_optimizer: How a client moves its private u_i: 'sgd' is Eq. 3,
      u <- u - lr_u grad; 'adam' keeps Adam moments in the client state.
    user_learning_rate: lr_u.
    update_rule: Where Adam runs. 'server_adam': each client uploads one
      gradient of its whole data (Algorithm 1 lines 16-26) and the server
      takes an Adam step on their sums, keeping the moments. 'local_adam':
      each client trains for `local_epochs` epochs of Adam from fresh
      moments (`dual_task.local_adam_changes`, u_i
      included, so `user_optimizer` / `user_learning_rate` are unused) and
      uploads its change; the server adds the clients' changes summed, as
      Eq. 4, 8, 9 and 15 write it with the step taken on the clients.
    local_epochs: L of Algorithm 1 ('local_adam' only).
    local_batch_size: 'local_adam' only: 0 makes an epoch one full-batch
      step; B > 0 makes it ceil(n / B) steps on batches of B of the
      client's examples in a fresh random order (seeded by the client
      data's `seeds`), as the first author's public FedRec code trains.
    validation_fraction: 'local_adam' only: the share of a selected
      client's examples held out to guide its local training (Sec. V.A:
      10%); the client keeps its epoch of lowest held-out loss
      (`dual_task.local_adam_changes`). The program draws the
      split every round (`client_data_type`'s `validation`); 0 keeps every
      example for training and the last epoch.
    change_aggregation: 'local_adam' only. 'sum': x <- x - sum_i d_i, as
      Eq. 4 / 8 / 15 write it. 'mean': FedAvg [10], which Sec. III.A
      cites for the aggregation, per coordinate: each Theta_b moves by the
      mean change of the clients that trained it, and each item row's
      slice of dimensions by the mean change of the clients that uploaded
      that row at that width.
      'fedavg': FedAvg of whole models, as the first author's public FedRec
      code averages the selected clients' state dicts: each row's slice
      moves by the sum of its changes over the number of the round's
      clients that hold that slice (padded: tier >= b; clustered: tier ==
      b), whether or not they trained the row, so an item few clients
      interacted with moves little; each Theta_b as under 'mean'.
    seed: Seeds the distillation item subsets.
  """

  learning_rate: float = 0.01
  dual_task: bool = True
  decorrelation_weight: float = 1.0
  distillation_items: int = 256
  distillation_learning_rate: float = 0.001
  aggregation: str = 'padded'
  user_optimizer: str = 'sgd'
  user_learning_rate: float = 0.001
  update_rule: str = 'server_adam'
  local_epochs: int = 1
  local_batch_size: int = 0
  validation_fraction: float = 0.0
  change_aggregation: str = 'sum'
  seed: int = 0

  def __post_init__(self):
    if self.user_optimizer not in USER_OPTIMIZERS:
      raise ValueError(
          f'user_optimizer must be one of {USER_OPTIMIZERS}; got '
          f'{self.user_optimizer!r}.'
      )
    if self.aggregation not in AGGREGATIONS:
      raise ValueError(
          f'aggregation must be one of {AGGREGATIONS}; got '
          f'{self.aggregation!r}.'
      )
    if self.update_rule not in UPDATE_RULES:
      raise ValueError(
          f'update_rule must be one of {UPDATE_RULES}; got '
          f'{self.update_rule!r}.'
      )
    if self.local_epochs < 1:
      raise ValueError(f'local_epochs must be >= 1; got {self.local_epochs}.')
    if self.local_epochs != 1 and self.update_rule != 'local_adam':
      raise ValueError(
          'local_epochs applies to update_rule="local_adam" only: under '
          '"server_adam" a client uploads one gradient per round.'
      )
    if self.local_batch_size < 0:
      raise ValueError(
          f'local_batch_size must be >= 0; got {self.local_batch_size}.'
      )
    if self.change_aggregation not in CHANGE_AGGREGATIONS:
      raise ValueError(
          f'change_aggregation must be one of {CHANGE_AGGREGATIONS}; got '
          f'{self.change_aggregation!r}.'
      )
    if not 0.0 <= self.validation_fraction < 1.0:
      raise ValueError(
          'validation_fraction must be in [0, 1); got '
          f'{self.validation_fraction}.'
      )
    if self.update_rule != 'local_adam' and (
        self.validation_fraction or self.change_aggregation != 'sum'
        or self.local_batch_size
    ):
      raise ValueError(
          'validation_fraction, change_aggregation and local_batch_size '
          'apply to '
          'update_rule="local_adam" only: under "server_adam" a client '
          'takes no local steps to guide and the server aggregates '
          'gradients.'
      )


def client_data_type() -> collections.OrderedDict:
  """D: a group of users of one tier (ids as in `user_groups`)."""
  return collections.OrderedDict(
      tier=tff.TensorType(np.int32),
      include=tff.TensorType(np.float32),
      **compact_tables.data_type(),
      validation=tff.TensorType(np.float32, [None, None]),
  )


def group_client_data(
    user_data: Sequence[collections.OrderedDict], *, tier: int,
    include: float = 1.0,
) -> collections.OrderedDict:
  """A group's client data (`client_data_type()`): the model tier it
  trains, whether its uploads count, `compact_tables.group_client_data` of its
  users, `validation` [U, N], 1 for the examples a user holds out (its
  optional `validation` entry; none without), and `seeds` [U, 2] (its
  optional `seed`; (0, 0) without), which only minibatch local training
  reads."""
  validation = user_groups.pad_rows(
      [np.asarray(d.get('validation', np.zeros(len(d['items']))),
                  np.float32) for d in user_data],
      np.float32,
  )
  seeded = [collections.OrderedDict(d, seed=d.get('seed', (0, 0)))
            for d in user_data]
  return collections.OrderedDict(
      tier=np.int32(tier), include=np.float32(include),
      **compact_tables.group_client_data(seeded), validation=validation,
  )


def local_state_type(spec: hetero_models.HeteroSpec) -> tff.Type:
  largest = spec.widths[-1]
  return tff.to_type(
      collections.OrderedDict(
          user=tff.TensorType(np.float32, [None, largest]),
          adam_m=tff.TensorType(np.float32, [None, largest]),
          adam_v=tff.TensorType(np.float32, [None, largest]),
          adam_step=tff.TensorType(np.float32, [None]),
      )
  )


def initial_local_state(
    spec: hetero_models.HeteroSpec, user_embedding: np.ndarray
) -> collections.OrderedDict:
  """One user's L before its first round (numpy)."""
  return collections.OrderedDict(
      user=np.asarray(user_embedding, np.float32),
      adam_m=np.zeros([spec.widths[-1]], np.float32),
      adam_v=np.zeros([spec.widths[-1]], np.float32),
      adam_step=np.float32(0.0),
  )



def _type_of(structure) -> tff.Type:
  return tff.to_type(
      tf.nest.map_structure(
          lambda x: tff.TensorType(np.asarray(x).dtype.type, np.shape(x)),
          structure,
      )
  )


def _averaging(config: HeteroConfig) -> bool:
  return config.change_aggregation in ('mean', 'fedavg')


def build_client_work(
    spec: hetero_models.HeteroSpec,
    initial_params: collections.OrderedDict,
    config: HeteroConfig,
    upload_codecs: Optional[Sequence[tier_codecs.UpdateCodec]] = None,
) -> roles.ClientWork:
  """The client work of the module docstring (Algorithm 1 lines 16-26);
  with `upload_codecs` (one per device tier) each user's message, its
  rows' and its scorers' changes, is encoded by its device tier
  (`encode_messages`)."""
  widths = spec.widths
  largest = widths[-1]
  received_type = distributors.Broadcast().received_type(
      _type_of(initial_params)
  )
  local_type = local_state_type(spec)
  data_type = client_data_type()
  if upload_codecs is not None:
    data_type['upload_tier'] = tff.TensorType(np.int32)
  data_type = tff.to_type(data_type)
  averaging = _averaging(config)
  num_device_tiers = len(upload_codecs or ())

  def encode_messages(tier, item_rows, layer_changes, data):
    """(item rows [U, T, w], the summed scorer changes, message bytes
    per device tier [D]): each user's real rows and its per-user changes
    of the scorers Theta_b it trains (b in L_a) decoded from its device
    tier's message (`tier_codecs.encode_users`)."""
    terms = dual_task.tier_terms(tier, config.dual_task)
    message = collections.OrderedDict(
        item_rows=item_rows,
        score_layers=tuple(layer_changes[b] for b in terms))
    users = tf.shape(item_rows)[0]
    decoded, sizes = tier_codecs.encode_users(
        upload_codecs, message, tf.fill([users], data['upload_tier']),
        tier_codecs.message_seeds(data['seeds']),
        row_counts={'item_rows': data['num_rows']})
    summed = list(tf.nest.map_structure(
        lambda c: tf.zeros(tf.shape(c)[1:]), layer_changes))
    for b, change in zip(terms, decoded['score_layers']):
      summed[b] = tf.nest.map_structure(
          lambda c: tf.reduce_sum(c, axis=0), change)
    sent = tf.one_hot(data['upload_tier'], num_device_tiers)
    return (decoded['item_rows'], tuple(summed),
            sent * tf.reduce_sum(sizes),
            sent * tf.cast(users, tf.float32))

  def tier_branch(tier, params, local, data):
    width = widths[tier]

    def run():
      rows = tf.gather(params['item_tables'][tier], data['row_ids'])
      row_mask = tf.sequence_mask(
          data['num_rows'], tf.shape(data['row_ids'])[1], tf.float32
      )
      # Held-out examples (`validation` 1) never enter the training loss.
      example_mask = tf.sequence_mask(
          data['num_examples'], tf.shape(data['items'])[1], tf.float32
      ) * (1.0 - data['validation'])
      user_state = adam.AdamState(
          m=local['adam_m'][:, :width],
          v=local['adam_v'][:, :width],
          step=local['adam_step'][:, None],
      )
      arguments = (
          dual_task.TierObjective(
              spec, tier, dual_task=config.dual_task,
              decorrelation_weight=config.decorrelation_weight),
          local['user'][:, :width], rows, params['score_layers'],
          dual_task.ClientExamples(
              row_mask, data['items'], data['labels'], example_mask),
      )
      if config.update_rule == 'local_adam':
        grads = dual_task.local_adam_changes(
            *arguments, learning_rate=config.learning_rate,
            local_epochs=config.local_epochs,
            validation_mask=(data['validation']
                             if config.validation_fraction else None),
            batch_size=config.local_batch_size, seeds=data['seeds'],
            sum_score_layers=upload_codecs is None,
        )
        user = grads.user
        kept_epoch_sum = tf.reduce_sum(grads.kept_epoch)
      else:
        if upload_codecs is not None:
          # Each user's own gradient of the scorers: their copies, one a
          # user (the sum is the shared gradient).
          num_users = tf.shape(data['num_rows'])[0]
          arguments = (*arguments[:3], tf.nest.map_structure(
              lambda v: tf.repeat(v[None], num_users, axis=0),
              arguments[3]), arguments[4])
        grads = dual_task.client_gradients(*arguments)
        kept_epoch_sum = tf.constant(0.0)
        if config.user_optimizer == 'adam':
          user, user_state = adam.apply(
              local['user'][:, :width], grads.user, user_state,
              learning_rate=config.user_learning_rate,
          )
        else:
          user = (local['user'][:, :width]
                  - config.user_learning_rate * grads.user)
      pad = lambda x: tf.pad(x, [[0, 0], [0, largest - width]])
      new_local = collections.OrderedDict(
          user=pad(user),
          adam_m=pad(user_state.m),
          adam_v=pad(user_state.v),
          adam_step=user_state.step[:, 0],
      )
      item_rows, layer_changes, codec_figures = (
          grads.item_rows, grads.score_layers, ())
      if upload_codecs is not None:
        item_rows, layer_changes, *codec_figures = encode_messages(
            tier, item_rows, layer_changes, data)
        codec_figures = tuple(f * data['include'] for f in codec_figures)
      real_rows = tf.cast(row_mask, tf.bool)
      table_grad = tf.scatter_nd(
          tf.expand_dims(tf.boolean_mask(data['row_ids'], real_rows), 1),
          tf.boolean_mask(item_rows, real_rows),
          [spec.num_items, width],
      )
      return (new_local, table_grad * data['include'],
              tf.nest.map_structure(lambda g: g * data['include'],
                                    layer_changes),
              grads.loss_sum, grads.num_examples,
              kept_epoch_sum * data['include'], codec_figures)

    return run

  def contributions(data, users):
    """How many of the group's `users` each mean divides by: per item row
    and tier b, the users whose upload reaches dimensions N_{b-1}:N_b of
    that row (padded: tier >= b; clustered: tier == b), counting under
    'mean' only those who trained the row and under 'fedavg' all of them;
    per Theta_b, the users who train it (Eq. 15's sets,
    `dual_task.tier_terms`)."""
    tier = data['tier']
    if config.change_aggregation == 'fedavg':
      # Every user of the group counts for every row: one count per tier
      # [3], which `mean_changes` broadcasts over the rows.
      touched = users
    else:
      row_mask = tf.sequence_mask(
          data['num_rows'], tf.shape(data['row_ids'])[1], tf.float32
      )
      touched = tf.scatter_nd(
          tf.reshape(data['row_ids'], [-1, 1]), tf.reshape(row_mask, [-1]),
          [spec.num_items],
      )
    tiers = tf.range(len(widths))
    if config.aggregation == 'padded':
      reaches = tier >= tiers
    else:
      reaches = tf.equal(tier, tiers)
    trains = (tiers <= tier) if config.dual_task else tf.equal(tiers, tier)
    return (
        tf.expand_dims(touched, -1) * tf.cast(reaches, tf.float32)
        * data['include'],
        users * tf.cast(trains, tf.float32) * data['include'],
    )

  @tff.tensorflow.computation(received_type, local_type, data_type)
  def client_update(received, local, data):
    params = received['global_parameters']
    (new_local, table_grad, layer_grads, loss_sum, num_examples,
     kept_epoch_sum, codec_figures) = (
        tf.switch_case(
            data['tier'],
            [tier_branch(t, params, local, data) for t in range(len(widths))],
        )
    )
    if config.aggregation == 'padded':
      table_upload = table_grad
    else:
      # Clustered: the upload lands in its own tier's table only.
      table_upload = tuple(
          tf.cond(
              tf.equal(data['tier'], tier),
              lambda: tf.reshape(table_grad, [spec.num_items, widths[tier]]),
              lambda: tf.zeros([spec.num_items, widths[tier]]),
          )
          for tier in range(len(widths))
      )
    users = tf.cast(tf.shape(data['num_rows'])[0], tf.float32)
    update = collections.OrderedDict(
        tables=table_upload, score_layers=layer_grads
    )
    if averaging:
      update['row_counts'], update['layer_counts'] = contributions(
          data, users)
    metrics = collections.OrderedDict(
        loss_sum=loss_sum, num_examples=num_examples,
        kept_epoch_sum=kept_epoch_sum,
        trained_users=users * data['include'],
    )
    if upload_codecs is not None:
      metrics['tier_upload_bytes'], metrics['tier_users'] = codec_figures
    return new_local, collections.OrderedDict(
        update=update, weight=users, metrics=metrics
    )

  return roles.client_work(client_update)


class TierChangesFactory(tff.aggregators.WeightedAggregationFactory):
  """The sums of HeteFedRec's uploads, or their means (weights unused).

  Item tables: padding-aware sums (Eq. 7-8, `padded_sum.PaddedSumFactory`)
  or, with aggregation 'clustered', one sum per tier; Theta_b: sums (Eq.
  15). Under change_aggregation 'mean' / 'fedavg' (`HeteroConfig`) every
  sum is divided by its contributors (the uploads' counts, at least 1).
  Result <item_tables: [V_s, V_m, V_l], score_layers: [Theta_s, Theta_m,
  Theta_l]> (the nest of the parameters); measurements
  <clients_per_width int32 [3]> (zeros when clustered).
  """

  def __init__(self, spec: hetero_models.HeteroSpec, config: HeteroConfig):
    self._spec = spec
    self._config = config

  def create(self, value_type, weight_type=tff.TensorType(np.float32)):
    del weight_type
    spec, config = self._spec, self._config
    widths = spec.widths
    value_type = tff.to_type(value_type)
    averaging = _averaging(config)
    if config.aggregation == 'padded':
      tables = padded_sum.PaddedSumFactory(widths).create(value_type.tables)
    else:
      tables = tff.aggregators.SumFactory().create(value_type.tables)
    layers = tff.aggregators.SumFactory().create(value_type.score_layers)
    count_type = (
        tff.to_type((value_type.row_counts, value_type.layer_counts))
        if averaging else tff.to_type(())
    )

    def mean_changes(table_sums, layer_sums, row_counts, layer_counts):
      """Sums divided by their contributors (at least 1)."""
      # [I, 3], or under 'fedavg' [3], the same for every row.
      row_counts = tf.maximum(tf.reshape(row_counts, [-1, len(widths)]), 1.0)
      if config.aggregation == 'padded':
        # Column b's count over dimensions N_{b-1}:N_b; tier a takes [:N_a].
        divisor = tf.repeat(row_counts, np.diff((0, *widths)), axis=1)
        tables = [table / divisor[:, : widths[tier]]
                  for tier, table in enumerate(table_sums)]
      else:
        tables = [table / row_counts[:, tier : tier + 1]
                  for tier, table in enumerate(table_sums)]
      layers = [
          tf.nest.map_structure(
              lambda x, b=b: x / tf.maximum(layer_counts[b], 1.0), layer)
          for b, layer in enumerate(layer_sums)
      ]
      return tables, layers

    @tff.tensorflow.computation(
        tff.to_type([tff.TensorType(np.float32, [spec.num_items, w])
                     for w in widths]),
        value_type.score_layers,
        count_type,
    )
    def changes(table_sums, layer_sums, counts):
      table_sums, layer_sums = list(table_sums), list(layer_sums)
      if averaging:
        table_sums, layer_sums = mean_changes(
            table_sums, layer_sums, *counts)
      return collections.OrderedDict(
          item_tables=table_sums, score_layers=layer_sums
      )

    @tff.federated_computation
    def initialize():
      return tff.federated_value((), tff.SERVER)

    @tff.federated_computation(
        initialize.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(np.float32, tff.CLIENTS),
    )
    def next_fn(state, value, weight):
      del weight
      table_output = tables.next(tables.initialize(), value.tables)
      if config.aggregation == 'padded':
        clients_per_width = table_output.measurements.clients_per_width
      else:
        clients_per_width = tff.federated_value(
            np.zeros([len(widths)], np.int32), tff.SERVER
        )
      layer_output = layers.next(layers.initialize(), value.score_layers)
      if averaging:
        counts = tff.federated_zip((
            tff.federated_sum(value.row_counts),
            tff.federated_sum(value.layer_counts),
        ))
      else:
        counts = tff.federated_value((), tff.SERVER)
      return tff.templates.MeasuredProcessOutput(
          state=state,
          result=tff.federated_map(
              changes, (table_output.result, layer_output.result, counts)
          ),
          measurements=tff.federated_zip(collections.OrderedDict(
              clients_per_width=clients_per_width
          )),
      )

    return tff.templates.AggregationProcess(initialize, next_fn)


def build_hetefedrec_process(
    spec: hetero_models.HeteroSpec,
    initial_params: collections.OrderedDict,
    config: HeteroConfig,
    upload_codecs: Optional[Sequence[tier_codecs.UpdateCodec]] = None,
) -> two_phase.TwoPhaseProcess:
  """Builds the process of the module docstring; `upload_codecs`: per
  device tier, how a user's message is encoded (RF²'s Prune / Quant /
  QuantS, `tier_codecs`), or None: sent as it is."""

  @tff.tensorflow.computation
  def initial_global_parameters():
    return tf.nest.map_structure(tf.constant, initial_params)

  client_work = build_client_work(spec, initial_params, config,
                                  upload_codecs)
  if config.update_rule == 'local_adam':
    # Eq. 4 / 9 / 15: the clients took the steps; add their sum.
    finalizer = finalizers.SubtractChanges()
  else:
    finalizer = finalizers.ServerAdam(
        initial_params, learning_rate=config.learning_rate
    )
  if config.distillation_items:
    finalizer = reskd.WithEnsembleDistillation(
        finalizer, num_items=config.distillation_items,
        learning_rate=config.distillation_learning_rate, seed=config.seed,
    )
  return composer.compose_client_state_process(
      initial_global_parameters=initial_global_parameters,
      distributor=distributors.Broadcast(),
      client_work=client_work,
      aggregator=TierChangesFactory(spec, config).create(
          client_work.upload_type.update, tff.TensorType(np.float32)
      ),
      finalizer=finalizer,
  )
