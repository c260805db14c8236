"""HeteFedRec (Yuan et al., ICDE 2024) and its baselines as one TFF process.

Clients belong to a tier a in (small, medium, large) and train a model of
their tier's size: item table V_a [I, N_a], scorer Theta_a, private user
embedding u_i [N_a] (`hetero_models`). Algorithm 1, one round:

  clients (`dual_task_learning.client_gradients`): one gradient of L'_a
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
(`dual_task_learning.local_adam_changes`); the server's step is
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

Type signature (U users of one tier per TFF client, see `user_groups`):

  initialize: ( -> S@SERVER)
  next: (<S@SERVER, {L}@CLIENTS, {D}@CLIENTS> -> <S@SERVER, {L}@CLIENTS, M@SERVER>)
  (a `two_phase.TwoPhaseProcess`: client_step, then server_step on the
  uploads U = <tables, score_layers, loss_sum, num_examples,
  kept_epoch_sum, trained_users>, and with
  change_aggregation 'mean' or 'fedavg' also <row_counts [I, 3] ([3]
  under 'fedavg', where every row has the same count), layer_counts [3]>,
  the divisors of the means; a real client's sparse upload of its rows
  carries the row counts, so `bytes_per_client` does not add them)

  S = <parameters: <item_tables, score_layers>, optimizer: <m, v, step>,
       round_num>
  L = <user [U, N_l], adam_m [U, N_l], adam_v [U, N_l], adam_step [U]>: the
      users' private embeddings and their Adam state, stored at the largest
      width (a tier-a user uses its first N_a entries; the rest stay 0)
  D = `client_data_type()`
  M = <train_loss, num_examples, mean_kept_epoch, distillation_loss_before
       /after, clients_per_width>; mean_kept_epoch is the mean over the
       round's training users of the local epoch each kept under
       'local_adam' (`dual_task_learning.local_adam_changes`: L without a
       validation split), 0 under 'server_adam'
"""

import collections
import dataclasses

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import adam
from tff_fedrec import distillation
from tff_fedrec import dual_task_learning
from tff_fedrec import hetero_models
from tff_fedrec.aggregators import padded_sum
from tff_fedrec.algorithms import two_phase

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
      while 0.01 learns beyond it (README, HeteFedRec), hence the default.
    dual_task: Unified dual-task learning (UDL, Eq. 11).
    decorrelation_weight: alpha of Eq. 14 (DDR); 0 turns DDR off. The paper
      sweeps 0.5 to 2.0 (Fig. 8) without naming its choice.
    distillation_items: |V_kd| of Eq. 16; 0 turns RESKD off.
    distillation_learning_rate: Step of Eq. 17's loss, Adam-like: every
      distilled coordinate moves by this much (`distillation`, step_rule
      'adam').
    aggregation: 'padded' (Eq. 8) or 'clustered' (each tier alone).
    user_optimizer: How a client moves its private u_i: 'sgd' is Eq. 3,
      u <- u - lr_u grad; 'adam' keeps Adam moments in the client state.
    user_learning_rate: lr_u.
    update_rule: Where Adam runs. 'server_adam': each client uploads one
      gradient of its whole data (Algorithm 1 lines 16-26) and the server
      takes an Adam step on their sums, keeping the moments. 'local_adam':
      each client trains for `local_epochs` epochs of Adam from fresh
      moments (`dual_task_learning.local_adam_changes`, u_i
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
      (`dual_task_learning.local_adam_changes`). The program draws the
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
      row_ids=tff.TensorType(np.int32, [None, None]),
      num_rows=tff.TensorType(np.int32, [None]),
      items=tff.TensorType(np.int32, [None, None]),
      labels=tff.TensorType(np.float32, [None, None]),
      num_examples=tff.TensorType(np.int32, [None]),
      seeds=tff.TensorType(np.int64, [None, 2]),
      validation=tff.TensorType(np.float32, [None, None]),
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


def build_hetefedrec_process(
    spec: hetero_models.HeteroSpec,
    initial_params: collections.OrderedDict,
    config: HeteroConfig,
) -> two_phase.TwoPhaseProcess:
  """Builds the process of the module docstring."""
  widths = spec.widths
  largest = widths[-1]
  params_type = _type_of(initial_params)
  local_type = local_state_type(spec)
  data_type = tff.to_type(client_data_type())
  table_upload_type = tff.TensorType(np.float32, [spec.num_items, None])
  layers_type = params_type.score_layers
  if config.aggregation == 'padded':
    table_aggregation = padded_sum.PaddedSumFactory(widths).create(
        table_upload_type
    )
  else:
    table_aggregation = None
  layer_aggregation = tff.aggregators.SumFactory().create(layers_type)
  averaging = config.change_aggregation in ('mean', 'fedavg')

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
          dual_task_learning.TierObjective(
              spec, tier, dual_task=config.dual_task,
              decorrelation_weight=config.decorrelation_weight),
          local['user'][:, :width], rows, params['score_layers'],
          dual_task_learning.ClientExamples(
              row_mask, data['items'], data['labels'], example_mask),
      )
      if config.update_rule == 'local_adam':
        grads = dual_task_learning.local_adam_changes(
            *arguments, learning_rate=config.learning_rate,
            local_epochs=config.local_epochs,
            validation_mask=(data['validation']
                             if config.validation_fraction else None),
            batch_size=config.local_batch_size, seeds=data['seeds'],
        )
        user = grads.user
        kept_epoch_sum = tf.reduce_sum(grads.kept_epoch)
      else:
        grads = dual_task_learning.client_gradients(*arguments)
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
      real_rows = tf.cast(row_mask, tf.bool)
      table_grad = tf.scatter_nd(
          tf.expand_dims(tf.boolean_mask(data['row_ids'], real_rows), 1),
          tf.boolean_mask(grads.item_rows, real_rows),
          [spec.num_items, width],
      )
      return (new_local, table_grad * data['include'],
              tf.nest.map_structure(lambda g: g * data['include'],
                                    grads.score_layers),
              grads.loss_sum, grads.num_examples,
              kept_epoch_sum * data['include'])

    return run

  def _contributions(data, users):
    """How many of the group's `users` each mean divides by: per item row
    and tier b, the users whose upload reaches dimensions N_{b-1}:N_b of
    that row (padded: tier >= b; clustered: tier == b), counting under
    'mean' only those who trained the row and under 'fedavg' all of them;
    per Theta_b, the users who train it (Eq. 15's sets,
    `dual_task_learning.tier_terms`)."""
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

  @tff.tensorflow.computation(params_type, local_type, data_type)
  def client_update(params, local, data):
    (new_local, table_grad, layer_grads, loss_sum, num_examples,
     kept_epoch_sum) = (
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
    upload = collections.OrderedDict(
        tables=table_upload, score_layers=layer_grads, loss_sum=loss_sum,
        num_examples=num_examples, kept_epoch_sum=kept_epoch_sum,
        trained_users=users * data['include'],
    )
    if averaging:
      upload['row_counts'], upload['layer_counts'] = _contributions(
          data, users)
    return new_local, upload

  @tff.tensorflow.computation
  def initial_state():
    params = tf.nest.map_structure(tf.constant, initial_params)
    zeros = tf.nest.map_structure(tf.zeros_like, params)
    return collections.OrderedDict(
        parameters=params,
        optimizer=collections.OrderedDict(
            m=zeros, v=zeros, step=tf.constant(0.0)
        ),
        round_num=tf.constant(0, tf.int32),
    )

  server_state_type = initial_state.type_signature.result

  count_types = (
      tff.TensorType(
          np.float32,
          [len(widths)] if config.change_aggregation == 'fedavg'
          else [spec.num_items, len(widths)],
      ),
      tff.TensorType(np.float32, [len(widths)]),
  )

  def mean_changes(table_sums, layer_sums, row_counts, layer_counts):
    """Sums divided by their contributors (`_contributions`; at least 1)."""
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
      server_state_type,
      tff.to_type([tff.TensorType(np.float32, [spec.num_items, w])
                   for w in widths]),
      layers_type,
      tff.to_type(count_types if averaging else ()),
  )
  def server_update(state, table_grads, layer_grads, counts):
    if averaging:
      table_grads, layer_grads = mean_changes(
          table_grads, layer_grads, *counts)
    # The same nest as the parameters, whatever sequence types TFF returns.
    grads = tf.nest.pack_sequence_as(
        state['optimizer']['m'],
        tf.nest.flatten(
            collections.OrderedDict(
                item_tables=list(table_grads), score_layers=list(layer_grads)
            )
        ),
    )
    if config.update_rule == 'local_adam':
      # Eq. 4 / 9 / 15: the clients took the steps; add their sum.
      params = tf.nest.map_structure(
          tf.subtract, state['parameters'], grads
      )
      optimizer = adam.AdamState(**state['optimizer'])
    else:
      params, optimizer = adam.apply(
          state['parameters'],
          grads,
          adam.AdamState(**state['optimizer']),
          learning_rate=config.learning_rate,
      )
    tables = list(params['item_tables'])
    loss_before = loss_after = tf.zeros([len(widths)])
    if config.distillation_items:
      item_ids = tf.random.experimental.stateless_shuffle(
          tf.range(spec.num_items),
          seed=tf.stack([tf.constant(config.seed, tf.int64),
                         tf.cast(state['round_num'], tf.int64)]),
      )[: min(config.distillation_items, spec.num_items)]
      result = distillation.ensemble_distillation(
          tables, item_ids,
          learning_rate=config.distillation_learning_rate,
          step_rule='adam',
      )
      tables = list(result.tables)
      loss_before = tf.stack(result.loss_before)
      loss_after = tf.stack(result.loss_after)
    params = collections.OrderedDict(
        item_tables=tables, score_layers=params['score_layers']
    )
    new_state = collections.OrderedDict(
        parameters=params,
        optimizer=collections.OrderedDict(
            m=optimizer.m, v=optimizer.v, step=optimizer.step
        ),
        round_num=state['round_num'] + 1,
    )
    return new_state, loss_before, loss_after

  @tff.federated_computation
  def initialize():
    return tff.federated_eval(initial_state, tff.SERVER)

  @tff.federated_computation(
      tff.FederatedType(server_state_type, tff.SERVER),
      tff.FederatedType(local_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS),
  )
  def client_step(server_state, local_states, client_data):
    return tff.federated_map(
        client_update,
        (
            tff.federated_broadcast(server_state.parameters),
            local_states,
            client_data,
        ),
    )

  @tff.federated_computation(
      tff.FederatedType(server_state_type, tff.SERVER),
      tff.FederatedType(
          client_update.type_signature.result[1], tff.CLIENTS
      ),
  )
  def server_step(server_state, uploads):
    if table_aggregation is not None:
      table_output = table_aggregation.next(
          table_aggregation.initialize(), uploads.tables
      )
      table_sums = table_output.result
      clients_per_width = table_output.measurements.clients_per_width
    else:
      table_sums = tff.federated_sum(uploads.tables)
      clients_per_width = tff.federated_value(
          np.zeros([len(widths)], np.int32), tff.SERVER
      )
    layer_output = layer_aggregation.next(
        layer_aggregation.initialize(), uploads.score_layers
    )
    if averaging:
      counts = tff.federated_zip((
          tff.federated_sum(uploads.row_counts),
          tff.federated_sum(uploads.layer_counts),
      ))
    else:
      counts = tff.federated_value((), tff.SERVER)
    new_state, loss_before, loss_after = tff.federated_map(
        server_update,
        (server_state, table_sums, layer_output.result, counts),
    )
    train_loss, num_examples = two_phase.mean_train_loss(uploads)
    mean_kept_epoch = two_phase.server_ratio(
        tff.federated_sum(uploads.kept_epoch_sum),
        tff.federated_sum(uploads.trained_users),
    )
    metrics = tff.federated_zip(
        collections.OrderedDict(
            train_loss=train_loss,
            num_examples=num_examples,
            mean_kept_epoch=mean_kept_epoch,
            distillation_loss_before=loss_before,
            distillation_loss_after=loss_after,
            clients_per_width=clients_per_width,
        )
    )
    return new_state, metrics

  return two_phase.TwoPhaseProcess(initialize, client_step, server_step)


@dataclasses.dataclass(frozen=True)
class HeteroMethod:
  """A built heterogeneous method.

  Attributes:
    spec: The three tiers' model sizes.
    config: What a round does.
    initial_parameters: `hetero_models.initial_parameters`.
    process: `build_hetefedrec_process`'s `two_phase.TwoPhaseProcess`.
    model_tier: The model tier a client of each data tier (small, medium,
      large by amount of data) trains.
    included: Whether each data tier's uploads reach the server.
    personal_models: Whether every client trains a whole model of its own
      (`standalone`) instead of the public parameters.
  """

  spec: hetero_models.HeteroSpec
  config: HeteroConfig
  initial_parameters: collections.OrderedDict
  process: tff.templates.IterativeProcess
  model_tier: tuple[int, int, int] = (0, 1, 2)
  included: tuple[bool, bool, bool] = (True, True, True)
  personal_models: bool = False


def _build(spec, config, seed, **kwargs) -> HeteroMethod:
  params = hetero_models.initial_parameters(spec, seed)
  return HeteroMethod(
      spec=spec,
      config=config,
      initial_parameters=params,
      process=build_hetefedrec_process(spec, params, config),
      **kwargs,
  )


def plain_config(config: HeteroConfig, **changes) -> HeteroConfig:
  """`config` without UDL, DDR and RESKD (a plain FedRec per tier)."""
  return dataclasses.replace(
      config, dual_task=False, decorrelation_weight=0.0,
      distillation_items=0, **changes,
  )


def build_hetefedrec(*, spec, config=HeteroConfig(), seed=0) -> HeteroMethod:
  """HeteFedRec (Algorithm 1); `config` selects Table IV's ablations."""
  return _build(spec, config, seed)


def build_direct_aggregate(*, spec, config=HeteroConfig(), seed=0):
  """'Directly Aggregate' (Sec. V.C): Eq. 8 without UDL, DDR and RESKD."""
  return _build(spec, plain_config(config), seed)


def build_clustered(*, spec, config=HeteroConfig(), seed=0):
  """'Clustered FedRec' (Sec. V.C): each tier aggregates only its own."""
  return _build(spec, plain_config(config, aggregation='clustered'), seed)


def build_all_small(*, spec, config=HeteroConfig(), seed=0):
  """'All Small' (Sec. V.C): every client trains the small model."""
  return _build(spec, plain_config(config), seed, model_tier=(0, 0, 0))


def build_all_large(*, spec, config=HeteroConfig(), seed=0):
  """'All Large' (Sec. V.C): every client trains the large model."""
  return _build(spec, plain_config(config), seed, model_tier=(2, 2, 2))


def build_all_large_exclusive(*, spec, config=HeteroConfig(), seed=0):
  """'All Large/Exclusive' (Sec. V.C): large models everywhere, but the
  uploads of the clients with little data (the small data tier) are
  dropped; those clients still train their own user embedding."""
  return _build(
      spec, plain_config(config), seed, model_tier=(2, 2, 2),
      included=(False, True, True),
  )
