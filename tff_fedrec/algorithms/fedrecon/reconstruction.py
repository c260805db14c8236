"""Reconstruction of client-local user embeddings, batched over users (numpy).

Federated Reconstruction (Singhal et al., NeurIPS 2021, Algorithm 1) never
stores local parameters: a client reconstructs its user embedding from scratch
on its own data, with the global item embedding frozen, before it trains or
is evaluated. This module runs that reconstruction for many users at once, as
TFF's `build_fed_recon` does for one client: minibatch SGD over the user's
examples in order, on the mean binary cross-entropy of each batch, for a
matrix-factorization model with logit <p_u, q_j>.

For a batch B_u of user u: p_u <- p_u - lr * (1/|B_u|) sum_{(j,y) in B_u}
(sigmoid(<p_u, q_j>) - y) q_j.
"""

import numpy as np


def _sigmoid(x: np.ndarray) -> np.ndarray:
  return 0.5 * (np.tanh(0.5 * x) + 1.0)


def _minibatches(offsets: np.ndarray, batch_size: int):
  """(user of each example [N], the examples of each batch step).

  Batch step b holds every user's examples b * batch_size .. (b + 1) *
  batch_size - 1 of its own segment, so one step advances all users by one
  minibatch, as each client would.
  """
  num_users = offsets.size - 1
  num_examples = int(offsets[-1])
  user_of = np.repeat(np.arange(num_users), np.diff(offsets))
  batch_of = (np.arange(num_examples) - offsets[user_of]) // batch_size
  num_batches = int(batch_of.max()) + 1 if num_examples else 0
  order = np.argsort(batch_of, kind='stable')
  bounds = np.searchsorted(batch_of[order], np.arange(num_batches + 1))
  return user_of, [
      order[bounds[batch] : bounds[batch + 1]] for batch in range(num_batches)
  ]


def reconstruct_user_embeddings(
    item_embedding: np.ndarray,
    offsets: np.ndarray,
    items: np.ndarray,
    labels: np.ndarray,
    initial_user_embedding: np.ndarray,
    *,
    learning_rate: float,
    batch_size: int,
    epochs: int = 1,
) -> np.ndarray:
  """Reconstructs every user's embedding with the item embedding frozen.

  Args:
    item_embedding: float [I, d], the global item embedding.
    offsets: int [U + 1]; user u's examples are items/labels[offsets[u]:
      offsets[u + 1]], in the order the client would batch them.
    items: int [N] item ids; labels: float [N] in {0, 1}.
    initial_user_embedding: float [d], where every reconstruction starts.
    learning_rate, batch_size, epochs: the reconstruction optimizer's SGD.

  Returns:
    float32 [U, d].
  """
  num_users = offsets.size - 1
  user_of, batches = _minibatches(offsets, batch_size)
  users = np.tile(
      np.asarray(initial_user_embedding, np.float64), (num_users, 1)
  )
  item_vectors = np.asarray(item_embedding, np.float64)[items]
  for _ in range(epochs):
    for rows in batches:
      owners = user_of[rows]
      logits = np.einsum('nd,nd->n', item_vectors[rows], users[owners])
      residual = _sigmoid(logits) - labels[rows]
      gradient = np.zeros_like(users)
      np.add.at(gradient, owners, residual[:, None] * item_vectors[rows])
      batch_sizes = np.bincount(owners, minlength=num_users)
      active = batch_sizes > 0
      users[active] -= (
          learning_rate * gradient[active] / batch_sizes[active, None]
      )
  return users.astype(np.float32)


def fine_tune_item_rows(
    item_embedding: np.ndarray,
    offsets: np.ndarray,
    items: np.ndarray,
    labels: np.ndarray,
    user_embeddings: np.ndarray,
    *,
    learning_rate: float,
    batch_size: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Each user's fine-tuned copy of its items' rows, user embeddings frozen.

  The post-reconstruction step of FedRecon's client (one epoch of minibatch
  SGD on q with p_u fixed), kept by the user as its personal item rows: the
  dual personalization of PFedRec (Sec. 4.2) added to FedRecon (Table 3).
  For a batch B_u of user u and an item j in it:
  q_uj <- q_uj - lr * (1/|B_u|) sum_{(j', y) in B_u, j' = j}
  (sigmoid(<p_u, q_uj>) - y) p_u, where q_uj starts at the global q_j.

  Args:
    item_embedding: float [I, d], the global item embedding.
    offsets, items, labels: as in `reconstruct_user_embeddings`.
    user_embeddings: float [U, d], e.g. the reconstructed ones.
    learning_rate, batch_size: the client optimizer's SGD.

  Returns:
    (row_offsets int64 [U + 1], item_ids int32 [R], rows float32 [R, d]):
    user u's fine-tuned rows are rows[row_offsets[u]:row_offsets[u + 1]],
    for the distinct items item_ids[...] of its examples, sorted.
  """
  num_users = offsets.size - 1
  num_items = item_embedding.shape[0]
  user_of, batches = _minibatches(offsets, batch_size)
  keys, key_of = np.unique(
      user_of.astype(np.int64) * num_items + items, return_inverse=True
  )
  key_of = key_of.reshape(-1)
  rows = np.asarray(item_embedding, np.float64)[keys % num_items]
  users = np.asarray(user_embeddings, np.float64)
  for examples in batches:
    owners = user_of[examples]
    example_keys = key_of[examples]
    logits = np.einsum('nd,nd->n', rows[example_keys], users[owners])
    batch_sizes = np.bincount(owners, minlength=num_users)
    scale = (_sigmoid(logits) - labels[examples]) / batch_sizes[owners]
    gradient = np.zeros([keys.size, users.shape[1]])
    np.add.at(gradient, example_keys, scale[:, None] * users[owners])
    rows -= learning_rate * gradient
  key_users = keys // num_items
  row_offsets = np.searchsorted(key_users, np.arange(num_users + 1))
  return (
      row_offsets.astype(np.int64),
      (keys % num_items).astype(np.int32),
      rows.astype(np.float32),
  )
