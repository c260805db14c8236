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
  counts = np.diff(offsets)
  user_of = np.repeat(np.arange(num_users), counts)
  batch_of = (np.arange(items.size) - offsets[user_of]) // batch_size
  users = np.tile(
      np.asarray(initial_user_embedding, np.float64), (num_users, 1)
  )
  item_vectors = np.asarray(item_embedding, np.float64)[items]
  num_batches = int(batch_of.max()) + 1 if items.size else 0
  order = np.argsort(batch_of, kind='stable')
  bounds = np.searchsorted(batch_of[order], np.arange(num_batches + 1))
  for _ in range(epochs):
    for batch in range(num_batches):
      rows = order[bounds[batch] : bounds[batch + 1]]
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
