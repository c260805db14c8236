"""RF² as a `Method` (`build_rf2`): DLRM or DIN trained on click-through
events by FedAvg with a tier-aware optimisation (Maeng et al., RecSys
'22), reported with its bytes per tier (the MDAC against a paired baseline
run is the training program's, `programs/paired_runs`, for every method).

The process is `process.build_process`; the users' groups and rounds are
the shared `templates.user_groups.run_round` (groups never span a tier);
scores are the global model's logits of the protocol's `FeatureRows`.
Exclude Lo and Overselect are client selections, which the protocol makes
(`tasks.client_selection`); this method only reports them.

Example:
  >>> method = build_rf2(data=run_data, seed=0, model='dlrm',
  ...                    tier_optimization='quants:4,8,32')
"""

import collections

import numpy as np
import tensorflow as tf

from tff_fedrec import client_state_store
from tff_fedrec import device_tiers
from tff_fedrec import tier_optimizations
from tff_fedrec.algorithms import method as method_lib
from tff_fedrec.algorithms.rf2 import models
from tff_fedrec.algorithms.rf2 import process as process_lib
from tff_fedrec.templates import user_groups

SERVER_LEARNING_RATE = 0.1  # MovieLens (Taobao: 0.01).
_SCORE_BATCH = 65536


class RF2Method(method_lib.Method):
  """The method of the module docstring."""

  def __init__(self, data: method_lib.RunData, spec: models.ClickModelSpec,
               optimization: tier_optimizations.TierOptimization, *,
               seed: int, server_learning_rate: float):
    if data.feature_shapes is None:
      raise ValueError('rf2 trains on click-through events: run it under '
                       'the click_through protocol.')
    if data.user_tiers is None:
      raise ValueError('rf2 needs each user\'s device tier.')
    self._data, self._spec, self._optimization = data, spec, optimization
    self._server_learning_rate = server_learning_rate
    self._tier_names = data.tier_names or device_tiers.TIER_NAMES
    initial = models.initial_parameters(spec, np.random.default_rng(seed))
    self._num_parameters = sum(x.size for x in tf.nest.flatten(initial))
    self.process = process_lib.build_process(
        spec, initial, codecs=optimization.codecs,
        channel_multipliers=optimization.channel_multipliers,
        server_learning_rate=server_learning_rate,
        genres_width=data.feature_shapes['genres_width'],
        history_length=data.feature_shapes['history_length'])
    self._logits = tf.function(lambda params, features: models.logits(
        spec, params, features))

  def initial_store(self) -> client_state_store.ClientStateStore:
    return client_state_store.ClientStateStore(self._data.num_users,
                                               process_lib.NO_STATE)

  def run_round(self, server_state, store, round_input, *,
                users_per_client=1, cohort_size=None):
    data = round_input.user_data
    tiers = self._data.user_tiers[round_input.users].astype(np.int32)

    def group_data(positions):
      rows = [data[p] for p in positions]
      return collections.OrderedDict(
          item=user_groups.pad_rows([r['item'] for r in rows], np.int32),
          genres=user_groups.pad_rows([r['genres'] for r in rows], np.int32),
          history=user_groups.pad_rows([r['history'] for r in rows], np.int32),
          label=user_groups.pad_rows([r['label'] for r in rows], np.float32),
          num_examples=np.array([r['label'].size for r in rows], np.int32),
          tier=tiers[positions],
          seed=np.stack([r['seed'] for r in rows]).astype(np.int64))

    state, metrics = user_groups.run_round(
        self.process, server_state, store, round_input.users,
        sizes=[d['label'].size for d in data], make_group_data=group_data,
        users_per_group=users_per_client, keys=tiers,
        cohort_size=cohort_size)
    measured = metrics['aggregator']
    row = {'train_loss': float(metrics['train_loss']),
           'upload_bytes': float(np.sum(measured['bytes_per_tier'])),
           'download_bytes': float(4 * self._num_parameters
                                   * round_input.users.size)}
    row.update(method_lib.tier_upload_figures(
        {'tier_upload_bytes': measured['bytes_per_tier'],
         'tier_users': measured['users_per_tier']}, self._tier_names))
    return method_lib.RoundResult(state, row)

  def score(self, server_state, store, examples) -> np.ndarray:
    del store  # The global model scores every user.
    params = tf.nest.map_structure(
        tf.constant, server_state['global_parameters'])
    features = examples.features
    size = features['item'].shape[0]
    return np.concatenate([
        self._logits(params, collections.OrderedDict(
            (k, v[start:start + _SCORE_BATCH]) for k, v in features.items())
        ).numpy() for start in range(0, size, _SCORE_BATCH)] or [
            np.zeros([0], np.float32)])

  def summary_fields(self, server_state, store, history) -> dict:
    del server_state, store
    fields = {**method_lib.tier_upload_summary(history),
              'model_bytes': 4 * self._num_parameters}
    return fields

  def results_rows(self, summary):
    rows = method_lib.tier_upload_rows(summary)
    return rows

  def config_summary(self):
    return {'model': self._spec.architecture,
            'embedding_dim': self._spec.embedding_dim,
            'tier_optimization': self._optimization.name,
            'server_learning_rate': self._server_learning_rate,
            'client_learning_rate': process_lib.CLIENT_LEARNING_RATE,
            'embedding_l2': process_lib.EMBEDDING_L2}

  def on_device_tiers(self) -> list[str]:
    return list(self._tier_names)

  def on_device_tier_model(self, server_state, store, tier):
    """The global model a phone of `tier` runs: the model itself, or its
    Channel sub-model (the units the tier keeps)."""
    del store
    if tier not in self._tier_names:
      raise ValueError(f'This run has no tier {tier!r}; its tiers: '
                       f'{", ".join(self._tier_names)}.')
    index = self._tier_names.index(tier)
    params = tf.nest.map_structure(np.asarray,
                                   server_state['global_parameters'])
    multipliers = self._optimization.channel_multipliers
    if multipliers is not None:
      params = tf.nest.map_structure(
          lambda p, m: np.asarray(p * m, np.float32), params,
          models.channel_masks(self._spec, multipliers[index]))
    return method_lib.OnDeviceModel(
        tier=tier, user=None, architecture=self._spec.architecture,
        params=params,
        eval_users=np.flatnonzero(self._data.user_tiers == index))

  def description(self):
    return (f'RF² {self._spec.architecture.upper()}, tier optimisation '
            f'{self._optimization.name}, {self._num_parameters:,} '
            'parameters')


def build_rf2(*, data: method_lib.RunData, seed: int = 0, model: str = 'dlrm',
              embedding_dim: int = 16, tier_optimization: str = 'none',
              server_learning_rate: float = SERVER_LEARNING_RATE) -> RF2Method:
  """RF² (module docstring).

  Args:
    data: The run's data (a click-through protocol's, with device tiers).
    seed: Seeds the initial model.
    model: 'dlrm' or 'din'.
    embedding_dim: d (16 in the paper).
    tier_optimization: `tier_optimizations.parse`'s value.
    server_learning_rate: Adagrad's (0.1 on MovieLens).
  """
  spec = models.ClickModelSpec(
      model, num_items=data.num_items,
      num_genres=(data.feature_shapes or {}).get('num_genres', 0),
      embedding_dim=embedding_dim)
  return RF2Method(data, spec, tier_optimizations.parse(tier_optimization),
                   seed=seed, server_learning_rate=server_learning_rate)
