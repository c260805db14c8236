"""Leave-one-out evaluation of every user's own model (PFedRec Sec. 6.1).

Each user scores its held-out item together with its 99 sampled negatives
using its client state (local parameters and, with dual personalization, its
fine-tuned item rows over the table it started its last round from, when the
store recorded one: `client_state_store`) and the current global parameters,
as the reference code evaluates `client_model_params[user]`. The scoring is
batched over users; the math is `models.logits_from_vectors`, the same the
clients train with.
"""

from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from tff_fedrec import client_state_store
from tff_fedrec import metrics
from tff_fedrec import models


# A user's own copy of shared score layers, as its last training left them
# (`local_item_training.ClientTrainingConfig.keeps_trained_model`): it
# scores the user in place of the global layers once the user has trained.
TRAINED_SCORE_LAYERS = 'trained_score_layers'
# float32, 1 once the user has trained (beside its trained copy): a user
# never selected has no model of its own and is scored with the global one
# (APFR-GKD spec 7.11).
HAS_OWN_MODEL = 'has_own_model'


def score_layers_of(local, global_params):
  """The score layers that score users of local state `local` (leading
  [U]): where they keep a trained copy (`TRAINED_SCORE_LAYERS`), that copy
  for a user that has trained and the global layers for one that has not;
  None where they keep none (their own local or the global layers
  apply)."""
  if TRAINED_SCORE_LAYERS not in local:
    return None
  trained = tf.nest.map_structure(np.asarray, local[TRAINED_SCORE_LAYERS])
  if HAS_OWN_MODEL not in local:
    return trained
  has_own = np.asarray(local[HAS_OWN_MODEL]) > 0
  return tf.nest.pack_sequence_as(trained, [
      np.where(has_own.reshape([-1] + [1] * (mine.ndim - 1)), mine,
               np.asarray(shared)[None]).astype(mine.dtype)
      for mine, shared in zip(tf.nest.flatten(trained),
                              tf.nest.flatten(global_params['score_layers']),
                              strict=True)
  ])


def score_candidates(
    spec: models.RecommenderSpec,
    global_params,
    store: client_state_store.ClientStateStore,
    candidates: np.ndarray,
    *,
    users: Optional[np.ndarray] = None,
    user_batch_size: int = 1024,
    item_vectors: Optional[
        Callable[[np.ndarray, np.ndarray], np.ndarray]] = None,
) -> np.ndarray:
  """Logits [U, C] of each user's model for its candidate items [U, C];
  `users` [U] (default: every user of the store, in order).
  `item_vectors(users, items)` gives the users' item vectors [U, C, d]
  (default: `store.item_vectors` over the global table)."""
  if users is None:
    users = np.arange(candidates.shape[0])
  item_embedding = np.asarray(global_params['item_embedding'])
  if item_vectors is None:
    def item_vectors(users, items):
      return store.item_vectors(users, items, item_embedding)
  shared = {k: v for k, v in global_params.items() if k != 'item_embedding'}
  scores = np.empty(candidates.shape, np.float32)
  for start in range(0, candidates.shape[0], user_batch_size):
    rows = np.arange(start, min(start + user_batch_size, candidates.shape[0]))
    params = dict(shared)
    local = store.stacked_local_parameters(users[rows])
    params.update((k, local[k]) for k in spec.local_keys)
    layers = score_layers_of(local, global_params)
    if layers is not None:
      params['score_layers'] = layers
    vectors = item_vectors(users[rows], candidates[rows])
    scores[rows] = models.logits_from_vectors(
        spec, params, tf.constant(vectors)
    ).numpy()
  return scores


def evaluate_leave_one_out(
    spec: models.RecommenderSpec,
    global_params,
    store: client_state_store.ClientStateStore,
    positives: np.ndarray,
    negatives: np.ndarray,
) -> dict[str, float]:
  """HR@K / NDCG@K / AUC over [positive, negatives] per user.

  Args:
    positives: int [U], each user's held-out item.
    negatives: int [U, M], its sampled negatives.
  """
  candidates = np.concatenate([positives[:, None], negatives], axis=1)
  scores = score_candidates(spec, global_params, store, candidates)
  return metrics.summarize_sampled(scores)
