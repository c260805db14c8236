"""Every user's own item-table model, scored on candidate items.

Each user scores candidates (its held-out item with sampled negatives, or
every item) with its client state (local parameters and, with dual
personalization, its fine-tuned item rows over the table it started its
last round from, `personal_rows`) and the current global parameters, as
PFedRec's reference code evaluates `client_model_params[user]`. The scoring
is batched over users; the math is `models.logits_from_vectors`, the same
the clients train with.
"""

from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from tff_fedrec import models


def score_candidates(
    spec: models.RecommenderSpec,
    global_params,
    store,
    candidates: np.ndarray,
    *,
    users: Optional[np.ndarray] = None,
    user_batch_size: int = 1024,
    item_vectors: Optional[
        Callable[[np.ndarray, np.ndarray], np.ndarray]] = None,
    score_layers: Optional[Callable] = None,
) -> np.ndarray:
  """Logits [U, C] of each user's model for its candidate items [U, C];
  `users` [U] (default: every user of the store, in order).
  `item_vectors(users, items)` gives the users' item vectors [U, C, d]
  (default: `store.item_vectors` over the global table);
  `score_layers(local state [U, ...], global parameters)` the score layers
  they are scored with when the method keeps its own ([U, ...]), else
  None: their local or the global layers, as the spec declares them."""
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
    layers = None if score_layers is None else score_layers(
        local, global_params)
    if layers is not None:
      params['score_layers'] = layers
    vectors = item_vectors(users[rows], candidates[rows])
    scores[rows] = models.logits_from_vectors(
        spec, params, tf.constant(vectors)
    ).numpy()
  return scores
