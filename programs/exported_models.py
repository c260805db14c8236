"""The models a trained run puts on phones, read from its program logic.

For every family of methods, the parameters of

- a tier's global model (`tier_models`): what a phone of that tier
  downloads. Its user part stays on the phone, so the model takes the user
  vector as input (`user_embedding`), except PFedRec, which has none: its
  global model is the aggregated item table with the initial score function,
  where a new device starts. Leave-one-out methods have one tier,
  'single'; the tiered methods one per model tier they train (HeteFedRec
  small / medium / large, All Small only small, ...). For Fed-LightGCN the
  input is the propagated vector u' (`hetero_models.user_representation`),
  which the phone computes from its own items.
- a user's own model (`user_model`): everything baked in, as the training
  side evaluates it: PFedRec's personal score function and fine-tuned item
  rows (dual personalization), FedMF / FedNCF / FedRecon's private user
  embedding, a tier model with the user's vector, Standalone's own model.

Each comes with the users it is evaluated on and its user vectors, so an
export can rank with the exported file exactly what training ranked.
"""

import collections
import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_fedrec import tiers
from tff_fedrec.programs import hetero_training_loop

SINGLE_TIER = 'single'


class ExportError(ValueError):
  """The run cannot give the requested model."""


@dataclasses.dataclass(frozen=True)
class ModelToExport:
  """One on-device model.

  Attributes:
    tier: 'single', 'small', 'medium' or 'large'.
    user: The user index it belongs to, or None for a tier's global model.
    architecture: One of `tff_fedrec.models.ARCHITECTURES`.
    params: `OrderedDict(item_embedding [I, d], score_layers [{kernel,
      bias}], user_embedding [d] (baked in; absent for a global model))`.
    eval_users: The user indices its evaluation covers.
    eval_user_vectors: float32 [len(eval_users), d], their user vectors
      when the model takes `user_embedding`, else None.
    representative_items: Item ids for full-integer calibration: the
      user's own training data, positives and sampled negatives (a global
      model: its first 64 evaluated users').
  """

  tier: str
  user: Optional[int]
  architecture: str
  params: collections.OrderedDict
  eval_users: np.ndarray
  eval_user_vectors: Optional[np.ndarray]
  representative_items: np.ndarray

  @property
  def embedding_dim(self) -> int:
    return int(self.params['item_embedding'].shape[1])


def _numpy(structure):
  return tf.nest.map_structure(np.asarray, structure)


def _representative_items(data, users) -> np.ndarray:
  """What the users' devices train on: their training positives plus 4
  sampled negatives per positive (seeded), as in local training. Positives
  alone calibrate int8 ranges on high scores only; the negatives' scores
  then clip (measured: PFedRec user models lost every test hit)."""
  _, items = hetero_training_loop.csr_rows(
      data.train_offsets, data.train_items, np.asarray(users)
  )
  positives = np.unique(items)
  candidates = np.setdiff1d(np.arange(data.num_items), positives)
  rng = np.random.default_rng(0)
  negatives = rng.choice(
      candidates, min(candidates.size, 4 * positives.size), replace=False
  )
  return np.union1d(positives, negatives).astype(np.int32)


def trained_tiers(prepared) -> list[str]:
  """The tiers whose global model the run trains."""
  if not prepared.tiered:
    return [SINGLE_TIER]
  if prepared.method.personal_models:
    return []
  return [tiers.TIER_NAMES[t] for t in sorted(set(prepared.method.model_tier))]


def _leave_one_out_tier(prepared, run) -> ModelToExport:
  method = prepared.method
  spec = method.spec
  global_params = _numpy(method.global_parameters(run.server_state))
  params = collections.OrderedDict(
      item_embedding=global_params['item_embedding']
  )
  if spec.has_score_layers:
    source = (global_params if 'score_layers' in spec.global_keys
              else method.initial_parameters)
    params['score_layers'] = _numpy(source['score_layers'])
  users = np.arange(prepared.data.num_users)
  vectors = None
  if spec.has_user_embedding:
    vectors = np.asarray(
        run.store.stacked_local_parameters(users)['user_embedding'],
        np.float32,
    )
  return ModelToExport(
      tier=SINGLE_TIER, user=None, architecture=spec.architecture,
      params=params, eval_users=users, eval_user_vectors=vectors,
      representative_items=_representative_items(prepared.data, users[:64]),
  )


def _leave_one_out_user(prepared, run, user: int) -> ModelToExport:
  method = prepared.method
  spec = method.spec
  global_params = _numpy(method.global_parameters(run.server_state))
  local = tf.nest.map_structure(
      lambda leaf: np.asarray(leaf)[0],
      run.store.stacked_local_parameters(np.array([user])),
  )
  num_items = prepared.data.num_items
  params = collections.OrderedDict(
      item_embedding=run.store.item_vectors(
          np.array([user]), np.arange(num_items)[None],
          global_params['item_embedding'].copy(),
      )[0]
  )
  if spec.has_score_layers:
    source = local if 'score_layers' in spec.local_keys else global_params
    params['score_layers'] = _numpy(source['score_layers'])
  if spec.has_user_embedding:
    params['user_embedding'] = np.asarray(local['user_embedding'], np.float32)
  return ModelToExport(
      tier=SINGLE_TIER, user=user, architecture=spec.architecture,
      params=params, eval_users=np.array([user]), eval_user_vectors=None,
      representative_items=_representative_items(prepared.data, [user]),
  )


def _tier_users_model(run, data, data_tier, users):
  """`run.user_model` of `users`, all of `data_tier`."""
  offsets, items = hetero_training_loop.csr_rows(
      data.train_offsets, data.train_items, users
  )
  return run.user_model(data_tier, users, offsets, items)


def _tiered_tier(prepared, run, tier_name: str) -> ModelToExport:
  method = prepared.method
  model_tier = tiers.TIER_NAMES.index(tier_name)
  users, vectors = [], []
  table = layers = None
  for data_tier in range(len(tiers.TIER_NAMES)):
    if method.model_tier[data_tier] != model_tier:
      continue
    tier_users = np.flatnonzero(run.data_tier == data_tier)
    if not tier_users.size:
      continue
    user, table, layers = _tier_users_model(
        run, prepared.data, data_tier, tier_users
    )
    users.append(tier_users)
    vectors.append(user)
  if table is None:
    raise ExportError(f'No user of the run trains the {tier_name} model.')
  users = np.concatenate(users)
  return ModelToExport(
      tier=tier_name, user=None, architecture='neural_cf',
      params=collections.OrderedDict(
          item_embedding=np.asarray(table), score_layers=_numpy(layers)
      ),
      eval_users=users, eval_user_vectors=np.concatenate(vectors),
      representative_items=_representative_items(prepared.data, users[:64]),
  )


def _tiered_user(prepared, run, user: int) -> ModelToExport:
  data_tier = int(run.data_tier[user])
  vector, table, layers = _tier_users_model(
      run, prepared.data, data_tier, np.array([user])
  )
  if np.ndim(table) == 3:  # One model per user (Standalone).
    table = table[0]
    layers = tf.nest.map_structure(lambda leaf: leaf[0], layers)
  model_tier = prepared.method.model_tier[data_tier]
  return ModelToExport(
      tier=tiers.TIER_NAMES[model_tier], user=user, architecture='neural_cf',
      params=collections.OrderedDict(
          item_embedding=np.asarray(table), score_layers=_numpy(layers),
          user_embedding=np.asarray(vector[0], np.float32),
      ),
      eval_users=np.array([user]), eval_user_vectors=None,
      representative_items=_representative_items(prepared.data, [user]),
  )


def tier_model(prepared, run, tier_name: str) -> ModelToExport:
  """The global model of `tier_name` (one of `trained_tiers`)."""
  trained = trained_tiers(prepared)
  if tier_name not in trained:
    raise ExportError(
        f'The {prepared.method_name} run trains no {tier_name!r} model; its '
        f'tiers: {", ".join(trained) or "none (every user trains its own)"}.'
    )
  if not prepared.tiered:
    return _leave_one_out_tier(prepared, run)
  return _tiered_tier(prepared, run, tier_name)


def user_model(prepared, run, user: int) -> ModelToExport:
  """User index `user`'s own model."""
  if prepared.tiered:
    return _tiered_user(prepared, run, user)
  return _leave_one_out_user(prepared, run, user)


def user_indices(data, requested) -> np.ndarray:
  """Indices of the users named by their original ids ('all': everyone)."""
  if list(requested) == ['all']:
    return np.arange(data.num_users)
  index = {str(u): i for i, u in enumerate(data.user_ids)}
  unknown = [u for u in requested if u not in index]
  if unknown:
    raise ExportError(
        f'Unknown user id(s) {", ".join(unknown)}: the run\'s data has '
        f'{data.num_users} users (ids as in the data file, e.g. '
        f'{", ".join(str(u) for u in data.user_ids[:3])}).'
    )
  return np.array([index[u] for u in requested], np.int64)
