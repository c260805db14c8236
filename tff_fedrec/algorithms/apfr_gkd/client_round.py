"""APFR-GKD's client round (Zhao et al., Algorithm 1, Eq. 8): what it
changes in the local-item client work (`local_items.client_training`).

  start      'download': the global model the client receives (Sec. 4.2's
             "replaces the local item embedding with the global"); or
             'own_model': theta_t^i <- theta_{t-1}^i - eta grad, its own
             model as its last training left it, whose item rows the
             program's store keeps (`personal_rows.OwnTableStore`) and
             sends in its data (`OWN_ROWS`), its score layers in its
             local state;
  loss term  mu tau^2 KL(teacher || student) (Eq. 8, `kd_loss`), the
             teacher being the broadcast buffered model
             (`global_buffer.TeacherBroadcast`) with the user's own p_i as
             it was before this training (spec section 7.2), its logits
             fixed for the whole phase; weight mu once a teacher exists;
  kept       every user keeps the model its training left, to be scored
             by: its trained item rows, and where the score layers are
             shared its trained copy of them (`TRAINED_SCORE_LAYERS`),
             with `HAS_OWN_MODEL` 1 once it has trained (a user never
             selected is scored with the global model, spec 7.11).

Example:
  >>> round_ = TrainedModelRound('own_model', DistillationOptions())
  >>> client_training.build_process(spec, params, training, exchange,
  ...                               client_round=round_, ...)
"""

import collections
import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import models
from tff_fedrec.algorithms.apfr_gkd import kd_loss
from tff_fedrec.algorithms.local_items import local_sgd

CLIENT_STARTS = ('download', 'own_model')
# The client-data field of a user's own item rows.
OWN_ROWS = 'own_rows'
# A user's own copy of shared score layers, as its last training left
# them: it scores the user in place of the global layers once the user has
# trained.
TRAINED_SCORE_LAYERS = 'trained_score_layers'
# float32, 1 once the user has trained (beside its trained copy).
HAS_OWN_MODEL = 'has_own_model'


@dataclasses.dataclass(frozen=True)
class DistillationOptions:
  """Distillation from the broadcast teacher (APFR-GKD Eq. 7-8).

  Attributes:
    weight: mu of Eq. 8 (FedGKD's default 0.1).
    temperature: tau of Eq. 7 (FedGKD's default 1).
    kind: 'binary' or 'listwise' (`kd_loss`).
  """

  weight: float = 0.1
  temperature: float = 1.0
  kind: str = 'binary'

  def __post_init__(self):
    if self.kind not in kd_loss.DISTILLATION_KINDS:
      raise ValueError(f'kind must be one of {kd_loss.DISTILLATION_KINDS}; '
                       f'got {self.kind!r}.')
    if not self.weight >= 0 or not self.temperature > 0:
      raise ValueError('The distillation weight must be >= 0 and the '
                       f'temperature > 0; got {self.weight}, '
                       f'{self.temperature}.')


def _keeps_score_layers(spec: models.RecommenderSpec) -> bool:
  return 'score_layers' in spec.global_keys


def _theta_keys(spec):
  return tuple(k for k in spec.global_keys if k != 'item_embedding')


@dataclasses.dataclass(frozen=True)
class TrainedModelRound:
  """A `client_training.ClientRound` (module docstring).

  Attributes:
    client_start: One of CLIENT_STARTS.
    distillation: The KD phase's distillation, or None (the Dual phase).
    first_step_keys: With alternating updates (the Dual phase), the
      parameters of each batch's first step.
  """

  client_start: str = 'download'
  distillation: Optional[DistillationOptions] = None
  first_step_keys: tuple[str, ...] = ()
  keeps_trained_rows = True

  def __post_init__(self):
    if self.client_start not in CLIENT_STARTS:
      raise ValueError(f'client_start must be one of {CLIENT_STARTS}; got '
                       f'{self.client_start!r}.')

  @property
  def starts_from_own_model(self) -> bool:
    return self.client_start == 'own_model'

  def local_state(self, spec, params) -> collections.OrderedDict:
    state = collections.OrderedDict()
    if _keeps_score_layers(spec):
      state[TRAINED_SCORE_LAYERS] = params['score_layers']
    state[HAS_OWN_MODEL] = np.float32(0.0)
    return state

  def data_fields(self, embedding_dim: int) -> collections.OrderedDict:
    if not self.starts_from_own_model:
      return collections.OrderedDict()
    return collections.OrderedDict({
        OWN_ROWS: tff.TensorType(np.float32, [None, None, embedding_dim])})

  def start(self, spec, broadcast, local, data, download):
    if not self.starts_from_own_model:
      return download()
    # The shared dense parameters are the score layers (`models`), whose
    # own copy is the one its last training left.
    start = collections.OrderedDict(
        (k, local[TRAINED_SCORE_LAYERS]) for k in _theta_keys(spec))
    start['item_embedding'] = data[OWN_ROWS]
    return start, collections.OrderedDict(), collections.OrderedDict()

  def loss_term(self, spec, broadcast, local, data, own):
    if self.distillation is None:
      return None
    options = self.distillation
    teacher = broadcast['teacher']
    num_users = tf.shape(data['num_examples'])[0]
    per_user = lambda v: tf.repeat(tf.expand_dims(v, 0), num_users, axis=0)
    params = tf.nest.map_structure(
        per_user,
        collections.OrderedDict((k, teacher[k]) for k in _theta_keys(spec)),
    )
    params.update(own)
    teacher_rows = tf.gather(teacher['item_embedding'], data['row_ids'])
    teacher_logits = models.logits_from_vectors(
        spec, params, tf.gather(teacher_rows, data['items'], batch_dims=1)
    )
    return distillation_term(
        tf.stop_gradient(teacher_logits),
        tf.fill([num_users], options.weight * broadcast['has_teacher']),
        options.temperature, options.kind,
    )

  def kept(self, spec, new_global, num_users) -> collections.OrderedDict:
    kept = collections.OrderedDict()
    if _keeps_score_layers(spec):
      kept[TRAINED_SCORE_LAYERS] = new_global['score_layers']
    kept[HAS_OWN_MODEL] = tf.ones([num_users], tf.float32)
    return kept


def distillation_term(teacher_logits, weights, temperature: float,
                      kind: str) -> local_sgd.LossTerm:
  """Eq. 8's term of each user's batch loss: weights[u] tau^2
  KL(teacher || student) over its real examples of the batch.

  Args:
    teacher_logits: float32 [U, N], the teacher's logit of every example,
      aligned with the users' items.
    weights: float32 [U], each user's mu (0: no distillation).
    temperature: tau.
    kind: 'binary' (the mean over the batch's examples of each one's
      two-class KL) or 'listwise' (the KL of the batch's softmaxes).
  """

  def term(logits, batch):
    teacher = batch.examples['teacher_logits']
    if kind == 'listwise':
      kd = kd_loss.listwise_kd_loss(teacher, logits, batch.mask, temperature)
    else:
      counts = tf.maximum(tf.reduce_sum(batch.mask, axis=1), 1.0)
      kd = tf.reduce_sum(
          kd_loss.binary_kd_loss(teacher, logits, temperature) * batch.mask,
          axis=1) / counts
    return weights * kd

  return local_sgd.LossTerm(
      examples={'teacher_logits': teacher_logits}, fn=term)


def trained_score_layers(spec, local, global_params):
  """The score layers users of local state `local` (leading [U]) are
  scored with: their trained copy once they have trained, the global
  layers before; None where the model's score layers are not shared."""
  if not _keeps_score_layers(spec):
    return None
  trained = tf.nest.map_structure(np.asarray, local[TRAINED_SCORE_LAYERS])
  has_own = np.asarray(local[HAS_OWN_MODEL]) > 0
  return tf.nest.pack_sequence_as(trained, [
      np.where(has_own.reshape([-1] + [1] * (mine.ndim - 1)), mine,
               np.asarray(shared)[None]).astype(mine.dtype)
      for mine, shared in zip(tf.nest.flatten(trained),
                              tf.nest.flatten(global_params['score_layers']),
                              strict=True)
  ])
