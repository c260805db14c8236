"""Methods whose clients train their own item rows with local SGD.

PFedRec (Zhang et al., IJCAI 2023), FedMF, FedNCF and, through their
exchange, FedRAS and its compression baselines are one process:
`composer.compose_client_state_process` with

  distributor  the exchange's (`exchanges`): a broadcast of the global
               parameters, or FedRAS's compressed downlink;
  client work  `build_client_work`: ClientUpdate of PFedRec's Algorithm 1
               (`local_sgd.train_users_locally`, alternating with dual
               personalization, joint otherwise, with distillation towards
               a broadcast teacher as an option: APFR-GKD Eq. 8) on a compact table holding
               only the T rows of the items in the user's data (Sec. 4.3,
               "Efficient on-device update"), so no client operation
               touches the whole [N, d] table; the rows start from the
               broadcast table or the client's own copy (the exchange),
               or, with `client_start='own_model'`, from the client's own
               model (its rows, which the program's store keeps, come in
               its data; APFR-GKD);
  aggregator   `aggregators.keyed.KeyedFactory(item=the exchange's
               factory, dense=tff.aggregators.MeanFactory())`, weighted by
               the users of each TFF client;
  finalizer    `finalizers.ApplyDelta`: global + the aggregated deltas
               (Algorithm 1, ServerExecute line 6; FedRAS Sec. 4.4), or,
               for FedRAS-E, trained rows replaced.

One TFF client simulates a group of U users (`templates.user_groups`; U =
1 is one device per client): each user trains on its own copy of the
parameters and the group uploads the mean of its users' uploads with
weight U, so a round's result does not depend on the grouping.

Types (`composer` gives S and M):

  L = the users' client-local parameters (score function, user
      embedding), leading dim [U], plus the exchange's state (FedRAS:
      item_copy [U, N, d], synced_round [U]) and, with
      `keeps_trained_model`, trained_score_layers and has_own_model [U]
      (APFR-GKD)
  C = <local_parameters: L, personal_item_ids int32[U, T],
       personal_item_rows float32[U, T, d]> (T = 0 unless the users keep
       their trained rows: dual personalization or `keeps_trained_model`),
       what the program stores per user; only L goes into `next`: a round
       starts from the global item rows (Algorithm 1, ClientUpdate line 1),
       so last round's fine-tuned rows are read only for inference; with
       `client_start='own_model'` the store merges them into the user's
       own table (`client_state_store.OwnTableStore`), whose rows of the
       round's items come back in D
  D = `client_data_type(exchange, training)` (see `templates.user_groups`)
  upload = <update=<item, [dense]>, weight=U, metrics=<loss_sum,
            num_examples, exchange's metrics>>
"""

import collections
import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec.algorithms.local_items import item_scoring
from tff_fedrec.algorithms.local_items import local_sgd
from tff_fedrec import models
from tff_fedrec.aggregators import keyed
from tff_fedrec.templates import composer
from tff_fedrec.templates import finalizers
from tff_fedrec.templates import two_phase


UNTRAINED_ITEM_ROWS = ('round_start', 'aggregated')
CLIENT_STARTS = ('download', 'own_model')
# The client-data field of a user's own item rows (`client_data_type`).
OWN_ROWS = 'own_rows'


@dataclasses.dataclass(frozen=True)
class DistillationOptions:
  """Distillation from the broadcast teacher (APFR-GKD Eq. 7-8).

  Attributes:
    weight: mu of Eq. 8 (FedGKD's default 0.1).
    temperature: tau of Eq. 7 (FedGKD's default 1).
    kind: 'binary' or 'listwise' (`knowledge_distillation`).
  """

  weight: float = 0.1
  temperature: float = 1.0
  kind: str = 'binary'

  def __post_init__(self):
    if self.kind not in local_sgd.DISTILLATION_KINDS:
      raise ValueError(f'kind must be one of '
                       f'{local_sgd.DISTILLATION_KINDS}; got '
                       f'{self.kind!r}.')
    if not self.weight >= 0 or not self.temperature > 0:
      raise ValueError('The distillation weight must be >= 0 and the '
                       f'temperature > 0; got {self.weight}, '
                       f'{self.temperature}.')


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
    alternating_first_keys: With dual personalization, the parameters of
      each batch's first step (empty: the client-local ones, PFedRec's
      Algorithm 1; APFR-GKD's Dual phase: user embedding and the shared
      score layers, then the item rows).
    keeps_trained_model: Keep each user's trained item rows and, where
      they are shared, its trained score layers (`trained_score_layers`
      in its local state, with `has_own_model`) to score it with
      (APFR-GKD: each client's model after its local training is its
      personalised model).
    client_start: What a round's local training starts from (CLIENT_STARTS):
      'download', the global parameters the client received (PFedRec's
      Algorithm 1, ClientUpdate line 1), or 'own_model', the client's own
      model as its last training left it (APFR-GKD's Algorithm 1 read as
      theta_t^i <- theta_{t-1}^i - eta grad: every item row it ever
      trained, the initial table's rows for the others, its own score
      layers); needs `keeps_trained_model`.
    distillation: None, or distillation towards the broadcast teacher
      (`distributors.TeacherBroadcast`).
  """

  learning_rate: float = 0.1
  item_learning_rate: Optional[float] = None
  item_lr_eta: float = 80.0
  user_learning_rate: Optional[float] = None
  batch_size: int = 256
  local_epochs: int = 1
  dual_personalization: bool = True
  untrained_item_rows: str = 'round_start'
  alternating_first_keys: tuple[str, ...] = ()
  keeps_trained_model: bool = False
  client_start: str = 'download'
  distillation: Optional[DistillationOptions] = None

  @property
  def keeps_personal_rows(self) -> bool:
    """Whether users keep the item rows they trained (to be scored by)."""
    return self.dual_personalization or self.keeps_trained_model

  @property
  def starts_from_own_model(self) -> bool:
    return self.client_start == 'own_model'

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
    if self.client_start not in CLIENT_STARTS:
      raise ValueError(f'client_start must be one of {CLIENT_STARTS}; got '
                       f'{self.client_start!r}.')


def client_data_type(
    exchange, training: Optional[ClientTrainingConfig] = None,
    embedding_dim: Optional[int] = None,
) -> collections.OrderedDict:
  """D: the data of one TFF client's group of U users (`user_groups`),
  with each user's bandwidth e_u when the exchange has one, and, when
  `training` starts from the client's own model, own_rows float32 [U, T,
  d]: each user's own rows of its compact table (`row_ids`), which the
  device holds and the simulation keeps in the program's store."""
  data_type = collections.OrderedDict(
      row_ids=tff.TensorType(np.int32, [None, None]),
      num_rows=tff.TensorType(np.int32, [None]),
      items=tff.TensorType(np.int32, [None, None]),
      labels=tff.TensorType(np.float32, [None, None]),
      num_examples=tff.TensorType(np.int32, [None]),
      seeds=tff.TensorType(np.int64, [None, 2]),
  )
  if exchange.uses_bandwidth:
    data_type['bandwidth'] = tff.TensorType(np.int32, [None])
  if training is not None and training.starts_from_own_model:
    data_type[OWN_ROWS] = tff.TensorType(
        np.float32, [None, None, embedding_dim])
  return data_type


def _type_of(structure, leading=()) -> tff.Type:
  return tff.to_type(tf.nest.map_structure(
      lambda leaf: tff.TensorType(
          np.asarray(leaf).dtype.type, [*leading, *np.shape(leaf)]
      ),
      structure,
  ))


def _keeps_trained_score_layers(spec, training) -> bool:
  return (training is not None and training.keeps_trained_model
          and 'score_layers' in spec.global_keys)


def initial_local_state(
    spec: models.RecommenderSpec, params: models.Parameters, exchange,
    training: Optional[ClientTrainingConfig] = None,
) -> collections.OrderedDict:
  """One user's L before its first round (numpy): the server's initial
  local parameters, as in the reference code (Algorithm 1, ServerExecute
  line 1), the exchange's state, and with `training.keeps_trained_model`
  the shared score layers as they were after its last training and
  `has_own_model` (0 until it trains: a user never selected is scored
  with the global model, APFR-GKD spec 7.11)."""
  _, local_params = models.split_parameters(spec, params)
  state = collections.OrderedDict(local_params)
  state.update(exchange.local_state(params['item_embedding']))
  if _keeps_trained_score_layers(spec, training):
    state[item_scoring.TRAINED_SCORE_LAYERS] = params['score_layers']
  if training is not None and training.keeps_trained_model:
    state[item_scoring.HAS_OWN_MODEL] = np.float32(0.0)
  return state


def initial_client_state(
    spec: models.RecommenderSpec, params: models.Parameters, exchange,
    training: Optional[ClientTrainingConfig] = None,
) -> collections.OrderedDict:
  """C of a user that has not trained yet: L and no personal rows."""
  return collections.OrderedDict(
      local_parameters=initial_local_state(spec, params, exchange, training),
      personal_item_ids=np.zeros([0], np.int32),
      personal_item_rows=np.zeros([0, spec.embedding_dim], np.float32),
  )


def _teacher_distillation(spec, options, broadcast, own, data, per_user,
                          dense_keys) -> local_sgd.Distillation:
  """The distillation of APFR-GKD's KD phase: the teacher is the broadcast
  teacher's item rows and shared layers with each user's own local
  parameters as they are before this training (spec section 7.2), its
  logits fixed for the whole phase; weight mu once a teacher exists."""
  teacher = broadcast['teacher']
  params = tf.nest.map_structure(
      per_user, collections.OrderedDict((k, teacher[k]) for k in dense_keys)
  )
  params.update(own)
  teacher_rows = tf.gather(teacher['item_embedding'], data['row_ids'])
  teacher_logits = models.logits_from_vectors(
      spec, params, tf.gather(teacher_rows, data['items'], batch_dims=1)
  )
  num_users = tf.shape(data['num_examples'])[0]
  return local_sgd.Distillation(
      teacher_logits=tf.stop_gradient(teacher_logits),
      weights=tf.fill([num_users], options.weight * broadcast['has_teacher']),
      temperature=options.temperature,
      kind=options.kind,
  )


def build_client_work(
    spec: models.RecommenderSpec,
    initial_params: models.Parameters,
    training: ClientTrainingConfig,
    exchange,
    broadcast_type: tff.Type,
) -> composer.ClientWork:
  """The client work of the module docstring."""
  training = training.for_items(spec.num_items)
  dense_keys = tuple(k for k in spec.global_keys if k != 'item_embedding')
  local_type = _type_of(
      initial_local_state(spec, initial_params, exchange, training),
      leading=[None],
  )
  data_type = tff.to_type(
      client_data_type(exchange, training, spec.embedding_dim))

  @tff.tensorflow.computation(broadcast_type, local_type, data_type)
  def client_update(broadcast, local, data):
    num_users = tf.shape(data['num_examples'])[0]
    per_user = lambda v: tf.repeat(tf.expand_dims(v, 0), num_users, axis=0)
    if training.starts_from_own_model:
      # The shared dense parameters are the score layers (`models`), whose
      # own copy is the one its last training left.
      start = collections.OrderedDict(
          (k, local[item_scoring.TRAINED_SCORE_LAYERS]) for k in dense_keys
      )
      start['item_embedding'] = data[OWN_ROWS]
      kept, exchange_metrics = (collections.OrderedDict(),
                                collections.OrderedDict())
    else:
      global_params = broadcast['global_parameters']
      start = tf.nest.map_structure(
          per_user,
          collections.OrderedDict((k, global_params[k]) for k in dense_keys),
      )
      start['item_embedding'], kept, exchange_metrics = exchange.start_rows(
          broadcast, local, data
      )
    own = collections.OrderedDict((k, local[k]) for k in spec.local_keys)
    distillation = None
    if training.distillation is not None:
      distillation = _teacher_distillation(
          spec, training.distillation, broadcast, own, data, per_user,
          dense_keys,
      )
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
        distillation=distillation,
        first_keys=training.alternating_first_keys or None,
        user_learning_rate=training.user_learning_rate,
    )
    new_global, new_local = models.split_parameters(spec, result.parameters)
    trained_rows = new_global['item_embedding']
    update = collections.OrderedDict(
        item=exchange.item_upload(
            data, start['item_embedding'], trained_rows,
            broadcast['round_num'],
        )
    )
    if dense_keys:
      update['dense'] = collections.OrderedDict(
          (k, tf.nest.map_structure(
              lambda new, old: tf.reduce_mean(new - old, axis=0),
              new_global[k], start[k],
          ))
          for k in dense_keys
      )
    if training.keeps_personal_rows:
      personal_ids, personal_rows = data['row_ids'], trained_rows
    else:
      personal_ids = tf.zeros([num_users, 0], tf.int32)
      personal_rows = tf.zeros([num_users, 0, spec.embedding_dim], tf.float32)
    new_local.update(kept)
    if _keeps_trained_score_layers(spec, training):
      new_local[item_scoring.TRAINED_SCORE_LAYERS] = new_global['score_layers']
    if training.keeps_trained_model:
      new_local[item_scoring.HAS_OWN_MODEL] = tf.ones([num_users], tf.float32)
    new_state = collections.OrderedDict(
        local_parameters=new_local,
        personal_item_ids=personal_ids,
        personal_item_rows=personal_rows,
    )
    metrics = collections.OrderedDict(
        loss_sum=tf.reduce_sum(result.loss_sum),
        num_examples=tf.cast(tf.reduce_sum(result.num_examples), tf.float32),
        **exchange_metrics,
    )
    return new_state, collections.OrderedDict(
        update=update, weight=tf.cast(num_users, tf.float32), metrics=metrics
    )

  return composer.ClientWork(client_update)


def _check_training(spec, training, exchange) -> None:
  """ValueError for a training the model or the exchange cannot take."""
  if training.user_learning_rate is not None and not spec.has_user_embedding:
    raise ValueError(
        f'The {spec.architecture} model has no user embedding; drop '
        '--user_learning_rate.'
    )
  if not training.starts_from_own_model:
    return
  if not training.keeps_trained_model:
    raise ValueError('client_start=own_model needs keeps_trained_model: the '
                     'model a client trains from is the one its last '
                     'training left.')
  if exchange.keeps_client_copies:
    raise ValueError(
        'client_start=own_model trains from the client\'s own rows; this '
        'exchange keeps a copy of the server\'s table on every client '
        'instead. Use the broadcast exchange.'
    )


def build_process(
    spec: models.RecommenderSpec,
    initial_params: models.Parameters,
    training: ClientTrainingConfig,
    exchange,
    *,
    item_aggregator: Optional[object] = None,
    model_aggregator: Optional[
        tff.aggregators.WeightedAggregationFactory] = None,
    distributor=None,
    finalizer=None,
) -> two_phase.TwoPhaseProcess:
  """Builds the process of the module docstring.

  Args:
    spec: The model and its global / local declaration.
    initial_params: Initial parameters (`models.initial_parameters`).
    training: Local training hyperparameters.
    exchange: An `exchanges` exchange.
    item_aggregator: Aggregates the item uploads (the exchange's
      `item_upload_type`); None means the exchange's `item_factory()`.
    model_aggregator: Aggregates the deltas of the other global parameters
      (FedNCF's shared MLP), weighted by users; None means
      `tff.aggregators.MeanFactory()`.
    distributor: None means the exchange's; `distributors.TeacherBroadcast`
      with distillation.
    finalizer: None means `finalizers.ApplyDelta`;
      `finalizers.BufferedGlobalModel` keeps APFR-GKD's buffer.
  """
  training = training.for_items(spec.num_items)
  _check_training(spec, training, exchange)
  global_init, _ = models.split_parameters(spec, initial_params)
  dense_keys = tuple(k for k in spec.global_keys if k != 'item_embedding')

  @tff.tensorflow.computation
  def initial_global_parameters():
    return tf.nest.map_structure(tf.constant, global_init)

  inner = collections.OrderedDict(
      item=item_aggregator or exchange.item_factory()
  )
  update_type = collections.OrderedDict(
      item=exchange.item_upload_type(spec.embedding_dim)
  )
  if dense_keys:
    inner['dense'] = model_aggregator or tff.aggregators.MeanFactory()
    update_type['dense'] = _type_of(
        collections.OrderedDict((k, global_init[k]) for k in dense_keys)
    )
  distributor = distributor or exchange.distributor
  broadcast_type = distributor.received_type(
      initial_global_parameters.type_signature.result
  )
  return composer.compose_client_state_process(
      initial_global_parameters=initial_global_parameters,
      distributor=distributor,
      client_work=build_client_work(
          spec, initial_params, training, exchange, broadcast_type
      ),
      aggregator=keyed.KeyedFactory(inner).create(
          tff.to_type(update_type), tff.TensorType(np.float32)
      ),
      finalizer=finalizer or finalizers.ApplyDelta(
          replaces_trained_rows=exchange.replaces_trained_rows
      ),
  )

