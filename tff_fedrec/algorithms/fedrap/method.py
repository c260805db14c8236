"""FedRAP as a `method.Method` (Li et al., ICLR 2024, arXiv 2301.09109).

  store    `client_state.PersonalTableStore`: each user's affine layer and
           the rows of D^(i) it trained, over the shared initial D_0;
  round    the users grouped U per TFF client (`templates.user_groups`),
           each group's data with its users' rows of D^(i) for the items
           of its round (`process`);
  bytes    the reference code's exchange: C [I, d] down and up, whole, for
           every user of the round (its L1 term makes C sparse, but the
           code sends it dense); `global_table_sparsity` is the fraction
           of C's entries with |C| <= 1e-4, the code's reported sparsity;
  scores   each user's own model, as the reference code evaluates every
           round: sigmoid(affine_u(D^(u)_j + C_j)) with its stored D^(u)
           and affine layer and the server's current C.

The model is PFedRec's one-layer score function on the item vector
D^(u)_j + C_j (`models`' 'score_function', score layers client-local),
so evaluation and export are those of every item-table method
(`item_method.ItemTableMethod`) with that vector.

Example:
  >>> method = build_fedrap(data=run_data, seed=0)
  >>> store, state = method.initial_store(), method.process.initialize()
  >>> result = method.run_round(state, store, round_input,
  ...                           users_per_client=32)
"""

import dataclasses
from typing import Optional

import numpy as np
import tensorflow_federated as tff

from tff_fedrec import models
from tff_fedrec import tier_optimizations
from tff_fedrec.algorithms import method
from tff_fedrec.algorithms.fedrap import client_state
from tff_fedrec.algorithms.fedrap import local_training
from tff_fedrec.algorithms.fedrap import process as process_lib
from tff_fedrec.algorithms.local_items import compact_tables
from tff_fedrec.algorithms.local_items import exchanges
from tff_fedrec.algorithms.local_items import item_method
from tff_fedrec.templates import user_groups

# The reference code counts |C| <= 1e-4 as zero.
SPARSITY_THRESHOLD = 1e-4
# Folded into the seed of D_0 so that it never equals C's initial draw.
_PERSONAL_TABLE_SEED_TAG = 1


def global_table_sparsity(table) -> float:
  """The fraction of entries of C with |C| <= 1e-4."""
  return float(np.mean(np.abs(np.asarray(table)) <= SPARSITY_THRESHOLD))


@dataclasses.dataclass(frozen=True)
class FedRAPMethod(item_method.ItemTableMethod):
  """FedRAP (module docstring).

  Attributes:
    spec: The score-function model whose item vector is D^(u)_j + C_j.
    training: The local training.
    initial_parameters: C's initial table (`item_embedding`) and the
      template affine layer (`score_layers`), numpy.
    initial_personal_table: D_0, float32 [I, d].
    process: `process.build_process`'s process.
    num_users: The users of the store.
    upload_tiers: int32 [U], each user's device tier when its messages are
      encoded by tier, else None.
    tier_names: The names of those tiers.
  """

  spec: models.RecommenderSpec
  training: local_training.FedRAPTrainingConfig
  initial_parameters: models.Parameters
  initial_personal_table: np.ndarray
  process: tff.templates.IterativeProcess
  num_users: int
  upload_tiers: Optional[np.ndarray] = None
  tier_names: tuple[str, ...] = ()

  def initial_store(self) -> client_state.PersonalTableStore:
    return client_state.PersonalTableStore(
        self.num_users,
        process_lib.initial_client_state(
            self.initial_parameters['score_layers'], self.spec.embedding_dim
        ),
        self.initial_personal_table,
    )

  def user_item_vectors(self, server_state, store, users, items):
    """D^(u)[items] + C[items], [U, C, d]."""
    table = np.asarray(self.global_parameters(server_state)['item_embedding'])
    return store.table_vectors(users, items) + table[items]

  def run_round(self, server_state, store, round_input, *,
                users_per_client: int = 1,
                cohort_size: Optional[int] = None) -> method.RoundResult:
    users = np.asarray(round_input.users)

    def group_data(positions):
      data = compact_tables.group_client_data(
          [round_input.user_data[p] for p in positions]
      )
      data['personal_rows'] = store.table_vectors(
          users[positions], data['row_ids']
      )
      if self.upload_tiers is not None:
        data['tier'] = self.upload_tiers[users[positions]].astype(np.int32)
      return data

    server_state, metrics = user_groups.run_round(
        self.process, server_state, store, users,
        sizes=[len(d['items']) for d in round_input.user_data],
        make_group_data=group_data, users_per_group=users_per_client,
        cohort_size=cohort_size,
    )
    table_bytes = exchanges.parameter_bytes(
        self.initial_parameters, ['item_embedding']
    ) * len(users)
    sent = exchanges.RoundBytes(*[table_bytes] * 6)
    return method.RoundResult(
        server_state=server_state,
        metrics={
            'train_loss': float(metrics['train_loss']),
            **{key: float(value) for key, value in sent._asdict().items()},
            'global_table_sparsity': global_table_sparsity(
                self.global_parameters(server_state)['item_embedding']
            ),
            **method.tier_upload_figures(metrics['client_work'],
                                         self.tier_names),
        },
    )

  def summary_fields(self, server_state, store, history):
    return {
        **super().summary_fields(server_state, store, history),
        'global_table_sparsity': global_table_sparsity(
            self.global_parameters(server_state)['item_embedding']
        ),
    }

  def on_device_tier_model(self, server_state, store, tier):
    """What a new phone starts from: D_0 + C and the template affine
    layer."""
    del tier  # One size.
    table = np.asarray(self.global_parameters(server_state)['item_embedding'])
    return item_method.on_device_tier_model(
        self.spec, {'item_embedding': table + self.initial_personal_table},
        self.initial_parameters, store,
    )

  def config_summary(self) -> dict:
    return {'training': dataclasses.asdict(self.training),
            'embedding_dim': self.spec.embedding_dim}

  def description(self) -> str:
    t = self.training
    return (f'lr_network {t.learning_rate:g}, lr_args '
            f'{t.item_learning_rate:g}, lambda {t.lam:g}, mu {t.mu:g} '
            f'({t.weight_schedule}), {t.local_epochs} local epochs.')


def build_fedrap(
    *,
    data: method.RunData,
    seed: int = 0,
    embedding_dim: int = 32,
    training: local_training.FedRAPTrainingConfig = (
        local_training.FedRAPTrainingConfig()),
    tier_optimization: str = 'none',
) -> FedRAPMethod:
  """Builds FedRAP for `data`'s users and items.

  One template model, as in the reference code: C ~ N(0, 1), D_0 ~ N(0, 1)
  and the affine layer U(+-1/sqrt(d)) (PyTorch's default), the same D_0 and
  affine layer for every user, all seeded by `seed`. `tier_optimization`
  may encode each user's message by its device tier
  (`tier_optimizations.upload_codecs`).
  """
  codecs = tier_optimizations.upload_codecs(tier_optimization,
                                            data.user_tiers)
  spec = models.RecommenderSpec(
      'score_function', data.num_items, embedding_dim,
      personal_score_layers=True,
  )
  params = models.initial_parameters(spec, seed)
  personal_table = np.random.default_rng(
      [seed, _PERSONAL_TABLE_SEED_TAG]
  ).normal(size=(data.num_items, embedding_dim)).astype(np.float32)
  initial_state = process_lib.initial_client_state(
      params['score_layers'], embedding_dim
  )
  return FedRAPMethod(
      spec=spec,
      training=training,
      initial_parameters=params,
      initial_personal_table=personal_table,
      process=process_lib.build_process(
          training, params['item_embedding'], initial_state, codecs
      ),
      num_users=data.num_users,
      **item_method.tier_upload_fields(codecs, data),
  )
