"""Score functions of the federated recommenders, as plain TF math.

PFedRec (Zhang et al., IJCAI 2023), Eq. (6): r_hat_ij = S_i(E_i(e^j)). The
prediction is sigmoid(logit); these functions return the logit.

Every function takes the parameters of ONE user, or of a batch of users when
the parameters carry a leading user dimension [U, ...]: `tf.matmul` broadcasts
over leading dimensions, so the same code serves local training (one user),
batched evaluation (all users at once) and the on-device export.

Shapes: `item_vectors` [..., C, d] (C candidate items), dense layers are
`(kernel [..., d_in, d_out], bias [..., d_out])` pairs; the last layer has
d_out = 1. Hidden layers use ReLU, as in NCF's MLP tower.
"""

from collections.abc import Sequence

import tensorflow as tf

DenseLayers = Sequence[tuple[tf.Tensor, tf.Tensor]]


def _apply_dense_layers(inputs: tf.Tensor, layers: DenseLayers) -> tf.Tensor:
  """Runs `inputs` [..., C, d_in] through the layers; returns [..., C]."""
  hidden = inputs
  for index, (kernel, bias) in enumerate(layers):
    hidden = tf.matmul(hidden, kernel) + tf.expand_dims(bias, -2)
    if index < len(layers) - 1:
      hidden = tf.nn.relu(hidden)
  return tf.squeeze(hidden, -1)


def score_function_logits(
    item_vectors: tf.Tensor, score_layers: DenseLayers
) -> tf.Tensor:
  """PFedRec's S_i(E_i(e^j)): an MLP (one dense layer in the paper) on the item
  embedding alone; there is no user embedding (Sec. 4.1). Returns [..., C]."""
  return _apply_dense_layers(item_vectors, score_layers)


def matrix_factorization_logits(
    item_vectors: tf.Tensor, user_embedding: tf.Tensor
) -> tf.Tensor:
  """FedMF's inner product <p_u, q_j> (Chai et al. 2020), user_embedding [..., d].

  Returns [..., C]."""
  return tf.linalg.matvec(item_vectors, user_embedding)


def neural_cf_logits(
    item_vectors: tf.Tensor, user_embedding: tf.Tensor, mlp_layers: DenseLayers,
    *, split_first_layer: bool = False,
) -> tf.Tensor:
  """FedNCF's MLP on [p_u ; q_j] (He et al. 2017, Perifanis & Efraimidis 2022).

  user_embedding [..., d] is repeated for each of the C items. Returns [..., C].

  With `split_first_layer` (HeteFedRec's Eq. 5, `hetefedrec.models`), the
  first layer, linear in [p_u ; q_j], is computed as a user part [..., 1,
  h] plus an item part [..., C, h] added per pair: the same function
  without the [..., C, 2d] concatenation, its own rounding; item vectors
  may then be [C, d], the same C items for every user, and kernels [U,
  f_in, f_out] with biases [U, f_out] give each user its own MLP.
  """
  if split_first_layer:
    return _split_first_layer_logits(item_vectors, user_embedding, mlp_layers)
  num_candidates = tf.shape(item_vectors)[-2]
  users = tf.repeat(
      tf.expand_dims(user_embedding, -2), num_candidates, axis=-2
  )
  return _apply_dense_layers(tf.concat([users, item_vectors], -1), mlp_layers)


def _split_first_layer_logits(item_vectors, user_embedding, layers):
  """`neural_cf_logits` with its first layer split (see there)."""
  width = tf.shape(user_embedding)[-1]  # Not always static inside TFF.
  kernel, bias = layers[0]
  hidden = (
      tf.matmul(user_embedding[..., None, :], kernel[..., :width, :])
      + tf.matmul(item_vectors, kernel[..., width:, :])
      + bias[..., None, :]
  )
  for kernel, bias in layers[1:]:
    hidden = tf.matmul(tf.nn.relu(hidden), kernel) + bias[..., None, :]
  return tf.squeeze(hidden, -1)
