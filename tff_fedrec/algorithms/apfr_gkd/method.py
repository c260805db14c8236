"""APFR-GKD's builder and round driver (Zhao et al., Algorithm 1).

Model: FedNCF's (Sec. 3): the user embedding p_i stays on the client, the
item embedding Q and the score function W ("a single-layer MLP", Sec. 6.3:
[p_i; q_j] -> Dense(32, ReLU) -> Dense(1), `hidden_units`) are shared.

Where a client's local training starts (`client_start`; the two
readings of Algorithm 1, spec section 9):

  'download'   every round the client's Q and W are the download (Sec.
               4.2's "replaces the local item embedding with the global");
               it keeps p_i, and the rows and layers its training left to
               be scored by;
  'own_model'  theta_t^i <- theta_{t-1}^i - eta grad (Algorithm 1): the
               client trains its own model, every item row it ever
               trained, theta_0's rows for the others, its own W; the
               buffered global model reaches it only as the distillation
               teacher (Table 3: "Unary ... only knowledge distillation is
               used"). It uploads its change, and the server adds the mean
               change over all users (`aggregators.population_mean`), so
               the global model is the mean of the client models (Eq. 1,
               exactly so with every user in the round); the buffer's
               average is the teacher and what a new user is served.

A round (Algorithm 1, the order of docs/methods/apfr_gkd.md):

  Dual only (P >= epsilon):  the round's clients train on BCE,
      PFedRec-style (each batch: a step on p_i and W with Q fixed, then a
      step on Q's rows); the server averages the uploads (Eq. 1), pushes
      the result into the buffer and, under 'download', replaces it by the
      buffer's average (Eq. 6; lines 7-10);
  always (the KD phase):     the clients receive the teacher (the
      buffer's average: the global model itself under 'download' with the
      default `student_start`), and train p_i, Q, W jointly on BCE + mu
      tau^2 KL(teacher || student) (Eq. 8) for E epochs, the teacher being
      the buffered model with the user's own p_i as it was before this
      phase; the server averages, pushes, replaces (lines 12-15).

Both phases are the process of `client_training.build_process`, with
`global_buffer.TeacherBroadcast` and `global_buffer.BufferedGlobalModel` (the
buffer is server state, so checkpointed); Dual runs two processes of the
same server state one after the other, two downloads and two uploads a
round, both counted. Each user keeps p_i and, to be scored by, its own
model: under 'download' the item rows and score layers its last training
left, the other items scored by the table it downloaded; under
'own_model' its whole model. A user never selected is scored with the
global model (spec 7.11).

Example:
  >>> method = build_apfr_gkd(data=run_data, seed=0)
  >>> method.mode, round(method.heterogeneity['p'], 3)
  ('unary', 1.234)
"""

import dataclasses
from typing import Optional

import numpy as np
import tensorflow_federated as tff

from tff_fedrec import models
from tff_fedrec import tier_optimizations
from tff_fedrec.aggregators import population_mean
from tff_fedrec.algorithms import method
from tff_fedrec.algorithms.apfr_gkd import client_round as client_round_lib
from tff_fedrec.algorithms.apfr_gkd import global_buffer
from tff_fedrec.algorithms.apfr_gkd import heterogeneity
from tff_fedrec.algorithms.local_items import client_training
from tff_fedrec.algorithms.local_items import exchanges
from tff_fedrec.algorithms.local_items import item_method
from tff_fedrec.algorithms.local_items import personal_rows

PERSONALIZATIONS = ('auto', 'unary', 'dual')
# Table 3's variants and two of the mechanisms alone.
ABLATIONS = {
    'unary': 'Unary: distillation only, whatever P is (Table 3)',
    'dual': 'Dual: the PFedRec-style phase, then distillation (Table 3)',
    'no_buffer': 'no buffer: the teacher is the latest aggregate (M = 1)',
    'no_kd': 'no distillation: mu = 0, the buffer kept',
}
# The user embedding and the shared score function first, then the item
# rows: PFedRec's alternation with the score function shared (Sec. 5.2).
_DUAL_PHASE_FIRST_KEYS = ('user_embedding', 'score_layers')
# The item rows' rate is a tenth of PFedRec's rule (0.1 x |I| x 8: 1,345.6
# on ML-100K): with ten local epochs PFedRec's x 80 diverges
# (docs/results/apfr_gkd.md).
DEFAULT_TRAINING = client_training.ClientTrainingConfig(
    learning_rate=0.1,
    item_lr_eta=8.0,
    local_epochs=10,
    dual_personalization=False,
)


@dataclasses.dataclass(frozen=True)
class APFRGKDMethod(item_method.LocalItemMethod):
  """APFR-GKD (module docstring).

  Attributes (besides `LocalItemMethod`'s; `process` is the KD phase's,
  `client_round` its `client_round.TrainedModelRound`):
    dual_process: The Dual phase's process (same server state), or None
      in Unary mode.
    mode: 'unary' or 'dual'.
    heterogeneity: {'p': P, 'threshold': epsilon, 'adapter_mode': what the
      adapter chose, 'chosen_by': 'adapter' or 'flag' or 'ablation'}.
    buffer_size: M.
    student_start: `global_buffer.BUFFER_STUDENT_STARTS` under
      `client_start='download'`; None under 'own_model' (the student is
      the client's own model).
    ablation: None or one of ABLATIONS.
    tier_optimization: May encode each user's upload by its device tier
      (`tier_optimizations.upload_codecs`).
  """

  dual_process: Optional[tff.templates.IterativeProcess] = None
  mode: str = 'unary'
  heterogeneity: dict = dataclasses.field(default_factory=dict)
  buffer_size: int = 5
  student_start: Optional[str] = 'buffer_average'
  ablation: Optional[str] = None

  @property
  def starts_from_own_model(self) -> bool:
    return self.client_round.starts_from_own_model

  def global_parameters(self, server_state):
    """The model the server serves (scores a user never selected, goes to
    a new phone): under 'own_model' the buffer's average, the teacher it
    broadcasts; else the global model clients start from."""
    if self.starts_from_own_model:
      return server_state['finalizer']['teacher']
    return super().global_parameters(server_state)

  def initial_store(self) -> personal_rows.PersonalRowsStore:
    """Under 'own_model' each user's own table: the rows it ever trained,
    merged round after round over theta_0's (`OwnTableStore`)."""
    if self.starts_from_own_model:
      return personal_rows.OwnTableStore(
          self.num_users, self.initial_client_state,
          self.initial_parameters['item_embedding'],
      )
    return super().initial_store()

  @property
  def records_start_tables(self) -> bool:
    # Under 'own_model' a user's untrained rows are theta_0's.
    return not self.starts_from_own_model and super().records_start_tables

  def group_data_fields(self, store, users, data) -> dict:
    """Under 'own_model' each user's own rows of its compact table, which
    the device holds and the simulation keeps in the store."""
    if not self.starts_from_own_model:
      return {}
    return {client_round_lib.OWN_ROWS: store.table_vectors(
        users, data['row_ids'])}

  def _start_vectors(self, store, users, items, global_table):
    """Under 'own_model', a user's untrained rows are theta_0's once it has
    trained, and the global model's before (spec 7.11)."""
    if not self.starts_from_own_model:
      return super()._start_vectors(store, users, items, global_table)
    has_own = np.asarray(store.stacked_local_parameters(users)[
        client_round_lib.HAS_OWN_MODEL]) > 0
    return np.where(has_own[:, None, None],
                    self.initial_parameters['item_embedding'][items],
                    global_table[items])

  def _score_layers(self, local, global_params):
    """Each user's trained copy of the shared score layers once it has
    trained, the global ones before."""
    return client_round_lib.trained_score_layers(
        self.spec, local, global_params)

  def run_round(self, server_state, store, round_input, *,
                users_per_client: int = 1,
                cohort_size: Optional[int] = None) -> method.RoundResult:
    figures = {}
    if self.dual_process is not None:
      server_state, figures = self.run_exchange(
          self.dual_process, server_state, store, round_input,
          users_per_client=users_per_client, cohort_size=cohort_size,
      )
    server_state, kd_figures = self.run_exchange(
        self.process, server_state, store, round_input,
        users_per_client=users_per_client, cohort_size=cohort_size,
    )
    if self.student_start == 'latest_aggregate':
      # The teacher is a second model beside the one trained from. (Under
      # 'own_model' the teacher is the only model a client needs.)
      extra = exchanges.parameter_bytes(
          self.initial_parameters, self.spec.global_keys
      ) * len(round_input.users)
      for key in ('download_bytes', 'dense_download_bytes',
                  'message_download_bytes', 'dense_message_download_bytes'):
        if key in kd_figures:
          kd_figures[key] += extra
    metrics = dict(kd_figures)
    for key, value in figures.items():
      if key.endswith('_bytes'):
        metrics[key] += value
    if figures:
      metrics['dual_phase_train_loss'] = figures['train_loss']
    return method.RoundResult(server_state=server_state, metrics=metrics)

  def summary_fields(self, server_state, store, history):
    fields = super().summary_fields(server_state, store, history)
    fields['heterogeneity'] = dict(self.heterogeneity)
    fields['personalization'] = self.mode
    fields['exchanges_per_round'] = 2 if self.dual_process else 1
    return fields

  def config_summary(self) -> dict:
    return {
        **super().config_summary(),
        'client_start': self.client_round.client_start,
        'distillation': dataclasses.asdict(self.client_round.distillation),
        'personalization': self.mode,
        'buffer_size': self.buffer_size,
        'student_start': self.student_start,
        'ablation': self.ablation,
    }

  def description(self) -> str:
    h = self.heterogeneity
    client_start = _CLIENT_START_TEXT[self.client_round.client_start]
    return (
        f'heterogeneity P = {h["p"]:.4f} (threshold {h["threshold"]:g}: '
        f'the adapter chooses {h["adapter_mode"]}); personalization '
        f'{self.mode} ({h["chosen_by"]}); buffer M = {self.buffer_size}; '
        f'clients start from {client_start}; ' + super().description()
    )


_CLIENT_START_TEXT = {
    'download': 'the download',
    'own_model': 'their own models (the teacher is the only download)',
}


def _personalization(personalization, ablation, adapter_mode):
  """(mode, chosen_by) from the flag, the ablation and the adapter."""
  forced = ablation if ablation in ('unary', 'dual') else None
  if forced:
    if personalization not in ('auto', forced):
      raise ValueError(
          f'The {ablation} ablation runs {forced} personalization; drop '
          f'--personalization={personalization} or use --method=apfr_gkd.')
    return forced, 'ablation'
  if personalization == 'auto':
    return adapter_mode, 'adapter'
  return personalization, 'flag'


def build_apfr_gkd(
    *,
    data: method.RunData,
    seed: int = 0,
    embedding_dim: int = 32,
    hidden_units: tuple[int, ...] = (32,),
    training: client_training.ClientTrainingConfig = DEFAULT_TRAINING,
    client_start: str = 'download',
    distillation: client_round_lib.DistillationOptions = (
        client_round_lib.DistillationOptions()),
    personalization: str = 'auto',
    heterogeneity_threshold: float = heterogeneity.DEFAULT_THRESHOLD,
    buffer_size: int = 5,
    student_start: Optional[str] = None,
    ablation: Optional[str] = None,
    tier_optimization: str = 'none',
) -> APFRGKDMethod:
  """Builds APFR-GKD (module docstring).

  Args:
    data: The users it trains (P is computed from their training items).
    seed: Initial parameters and P's k-means.
    embedding_dim: d of p_i and q_j (32, Sec. 6.3).
    hidden_units: Hidden layers of the score MLP (empty: one dense layer).
    training: The local training of both phases.
    client_start: The reading of Algorithm 1 (module docstring):
      'download' or 'own_model'.
    distillation: The KD phase's mu, tau, binary or list-wise.
    personalization: 'auto' (the adapter: Dual iff P >= threshold),
      'unary' or 'dual'.
    heterogeneity_threshold: epsilon.
    buffer_size: M of Eq. 6.
    student_start: Under `client_start='download'`: 'buffer_average'
      (Algorithm 1, the default) or 'latest_aggregate' (FedGKD: the
      teacher alone is the average). Not taken under 'own_model'.
    ablation: None or one of ABLATIONS.
  """
  codecs = tier_optimizations.upload_codecs(tier_optimization,
                                            data.user_tiers)
  if personalization not in PERSONALIZATIONS:
    raise ValueError(f'personalization must be one of {PERSONALIZATIONS}; '
                     f'got {personalization!r}.')
  if ablation is not None and ablation not in ABLATIONS:
    raise ValueError(f'Unknown ablation {ablation!r}; one of '
                     f'{", ".join(ABLATIONS)}.')
  if training.dual_personalization:
    raise ValueError(
        'APFR-GKD trains its KD phase jointly; its PFedRec-style phase is '
        '--personalization=dual. Drop --dual_personalization.')
  if ablation == 'no_kd':
    distillation = dataclasses.replace(distillation, weight=0.0)
  if ablation == 'no_buffer':
    buffer_size = 1
  training = training.for_items(data.num_items)
  kd_round = client_round_lib.TrainedModelRound(
      client_start=client_start, distillation=distillation)
  own_model = kd_round.starts_from_own_model
  if own_model and student_start is not None:
    raise ValueError(
        '--student_start sets what the student starts from after a '
        'download; with --client_start=own_model it starts from the '
        'client\'s own model. Drop --student_start.')
  if not own_model:
    student_start = student_start or 'buffer_average'

  p = heterogeneity.heterogeneity(
      data.train_offsets, data.train_items, data.num_items, seed=seed
  )
  adapter_mode = heterogeneity.personalization_mode(
      p, heterogeneity_threshold)
  mode, chosen_by = _personalization(personalization, ablation, adapter_mode)

  spec = models.RecommenderSpec(
      'neural_cf', data.num_items, embedding_dim, tuple(hidden_units),
      personal_score_layers=False,
  )
  exchange = exchanges.BroadcastOptions().build(
      num_items=spec.num_items, embedding_dim=spec.embedding_dim, seed=seed,
      user_tiers=data.user_tiers,
  )
  params = models.initial_parameters(spec, seed)
  global_initial, _ = models.split_parameters(spec, params)

  aggregators = {}
  if own_model:
    # The clients' changes from their own models, averaged over every user
    # (a user outside the round changed nothing), added to the latest
    # aggregate: the global model stays the mean of the client models and
    # the buffer's average is the teacher only.
    aggregators = dict(
        item_aggregator=population_mean.PopulationMeanFactory(
            exchange.item_factory(), population=data.num_users),
        model_aggregator=population_mean.PopulationMeanFactory(
            tff.aggregators.MeanFactory(), population=data.num_users),
    )

  def process_of(phase_training, phase_round):
    return client_training.build_process(
        spec, params, phase_training, exchange, client_round=phase_round,
        distributor=global_buffer.TeacherBroadcast(),
        finalizer=global_buffer.BufferedGlobalModel(
            global_initial, buffer_size=buffer_size,
            student_start='latest_aggregate' if own_model else student_start,
        ),
        upload_codecs=codecs,
        **aggregators,
    )

  dual_process = None
  if mode == 'dual':
    dual_process = process_of(
        dataclasses.replace(training, dual_personalization=True),
        dataclasses.replace(kd_round, distillation=None,
                            first_step_keys=_DUAL_PHASE_FIRST_KEYS),
    )
  return APFRGKDMethod(
      spec=spec,
      training=training,
      exchange=exchange,
      initial_parameters=params,
      process=process_of(training, kd_round),
      num_users=data.num_users,
      client_round=kd_round,
      scored_items=data.scored_items,
      dual_process=dual_process,
      mode=mode,
      heterogeneity={'p': p, 'threshold': heterogeneity_threshold,
                     'adapter_mode': adapter_mode, 'chosen_by': chosen_by},
      buffer_size=buffer_size,
      student_start=student_start,
      ablation=ablation,
      **item_method.tier_upload_fields(codecs, data),
  )
