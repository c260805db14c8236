"""The models a trained run puts on phones, read from its method.

A run's method gives (`method.Method.on_device_*`)

- a tier's global model: what a phone of that tier downloads. Its user
  part stays on the phone, so the model takes the user vector as input
  (`user_embedding`), except PFedRec, which has none: its global model is
  the aggregated item table with the initial score function, where a new
  device starts. One-size methods have one tier, 'single'; the tiered
  methods one per model tier they train (HeteFedRec small / medium /
  large, All Small only small, ...). For Fed-LightGCN the input is the
  propagated vector u' (`hetero_models.user_representation`), which the
  phone computes from its own items.
- a user's own model: everything baked in, as the training side evaluates
  it: PFedRec's personal score function and fine-tuned item rows (dual
  personalization), FedMF / FedNCF / FedRecon's private user embedding, a
  tier model with the user's vector, Standalone's own model.

Each comes with the users it is evaluated on and its user vectors, so an
export can rank with the exported file exactly what training ranked; this
module adds the items that calibrate full-integer quantization.
"""

import dataclasses

import numpy as np

from tff_fedrec import csr
from tff_fedrec.algorithms import method as method_lib


class ExportError(ValueError):
  """The run cannot give the requested model."""


@dataclasses.dataclass(frozen=True)
class ModelToExport(method_lib.OnDeviceModel):
  """One on-device model (`method.OnDeviceModel`) and its calibration
  items (`representative_items`): the user's own training data, positives
  and sampled negatives (a global model: its first 64 evaluated users')."""

  representative_items: np.ndarray = None

  @classmethod
  def of(cls, model: method_lib.OnDeviceModel, representative_items):
    return cls(
        **{field.name: getattr(model, field.name)
           for field in dataclasses.fields(model)},
        representative_items=representative_items,
    )

  @property
  def embedding_dim(self) -> int:
    return int(self.params['item_embedding'].shape[1])


def _representative_items(data, users) -> np.ndarray:
  """What the users' devices train on: their training positives plus 4
  sampled negatives per positive (seeded), as in local training. Positives
  alone calibrate int8 ranges on high scores only; the negatives' scores
  then clip (measured: PFedRec user models lost every test hit)."""
  _, items = csr.rows_of(data.train_offsets, data.train_items,
                         np.asarray(users))
  positives = np.unique(items)
  candidates = np.setdiff1d(np.arange(data.num_items), positives)
  rng = np.random.default_rng(0)
  negatives = rng.choice(
      candidates, min(candidates.size, 4 * positives.size), replace=False
  )
  return np.union1d(positives, negatives).astype(np.int32)


def trained_tiers(prepared) -> list[str]:
  """The tiers whose global model the run trains."""
  return prepared.method.on_device_tiers()


def tier_model(prepared, run, tier_name: str) -> ModelToExport:
  """The global model of `tier_name` (one of `trained_tiers`)."""
  trained = trained_tiers(prepared)
  if tier_name not in trained:
    raise ExportError(
        f'The {prepared.method_name} run trains no {tier_name!r} model; its '
        f'tiers: {", ".join(trained) or "none (every user trains its own)"}.'
    )
  model = prepared.method.on_device_tier_model(
      run.server_state, run.store, tier_name
  )
  return ModelToExport.of(
      model, _representative_items(prepared.data, model.eval_users[:64])
  )


def user_model(prepared, run, user: int) -> ModelToExport:
  """User index `user`'s own model."""
  try:
    model = prepared.method.on_device_user_model(
        run.server_state, run.store, user
    )
  except ValueError as error:
    raise ExportError(
        f'Cannot export user {prepared.data.user_ids[user]!r}: {error}'
    ) from error
  return ModelToExport.of(
      model, _representative_items(prepared.data, [user])
  )


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
