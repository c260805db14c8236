"""Local training of clients, as plain TF math (no `tff.*`).

Implements ClientUpdate of PFedRec's Algorithm 1 (Zhang et al., IJCAI 2023)
and the joint update of the FedMF / FedNCF / FedRecon baselines:

- `alternating=True` (dual personalization, Sec. 4.3): on every batch, first
  one SGD step on the client-local parameters with the item embedding fixed
  (lines 8-9), then the loss is computed again and one SGD step is taken on
  the item embedding and any global dense parameters (lines 10-11).
- `alternating=False`: one SGD step on all parameters per batch.

The loss is Eq. (7), the binary cross-entropy, averaged over the batch as the
reference code's `BCELoss` does. The item embedding has its own learning rate:
the reference code uses lr * num_items * 80 for it (docs/methods/pfedrec.md).
The user embedding may have its own too (`user_learning_rate`): every
example of a batch reaches p_u while an item row sees a few, so under the
mean-reduced loss p_u's gradient is one example's size and an item row's a
B-th of it; at the shared rate p_u barely moves (APFR-GKD,
docs/results/apfr_gkd.md).

Item rows are updated sparsely: only the rows of the batch's items change
(duplicates accumulate, as PyTorch's embedding gradient does). With
`item_gradient_maps` M_u [d, d], user u's row gradients G become G M_u
before the step: CoLR trains its low-rank update through the loss that way
(`gradient_compression.colr_gradient_map`).

`train_users_locally` trains U clients at once, each on its own copy of every
parameter (leading dimension [U]): user u's batch b holds its own examples
b*B .. (b+1)*B - 1, padding is masked out of the loss, and a user whose data
has run out takes no step (zero gradient). Each user's result is therefore
that of training it alone (`train_locally`, the case U = 1), while the TF
ops, and the TFF client that runs them, are shared by U users.
"""

import collections
from typing import Any, NamedTuple, Optional

import tensorflow as tf

from tff_fedrec.algorithms.apfr_gkd import kd_loss
from tff_fedrec import models

LocalTrainingResult = collections.namedtuple(
    'LocalTrainingResult', ['parameters', 'loss_sum', 'num_examples']
)

DISTILLATION_KINDS = ('binary', 'listwise')


class Distillation(NamedTuple):
  """Distillation towards a fixed teacher (APFR-GKD Eq. 7-8).

  Attributes:
    teacher_logits: float32 [U, N], the teacher's logit of every example
      of every user (aligned with `items`), or, inside a step, of the
      batch's [U, B].
    weights: float32 [U], each user's mu (0: no distillation).
    temperature: tau.
    kind: One of DISTILLATION_KINDS (`kd_loss`).
  """

  teacher_logits: tf.Tensor
  weights: tf.Tensor
  temperature: float = 1.0
  kind: str = 'binary'


def _user_batch_losses(spec, params, rows, labels, mask, distillation=None):
  """Per-user mean BCE (Eq. 7) over the user's real examples [U], plus,
  with `distillation` (a `Distillation` with the batch's teacher logits
  [U, B]), weight * tau^2 KL(teacher || student) (APFR-GKD Eq. 8)."""
  logits = models.logits_from_vectors(spec, params, rows)
  losses = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
  counts = tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)
  user_losses = tf.reduce_sum(losses * mask, axis=1) / counts
  if distillation is None:
    return user_losses
  if distillation.kind == 'listwise':
    kd = kd_loss.listwise_kd_loss(
        distillation.teacher_logits, logits, mask, distillation.temperature)
  else:
    kd = tf.reduce_sum(
        kd_loss.binary_kd_loss(
            distillation.teacher_logits, logits, distillation.temperature)
        * mask, axis=1) / counts
  return user_losses + distillation.weights * kd


def _sgd_step(
    spec: models.RecommenderSpec,
    params: dict[str, Any],
    batch_items: tf.Tensor,
    batch_labels: tf.Tensor,
    mask: tf.Tensor,
    keys: tuple[str, ...],
    learning_rate: float,
    item_learning_rate: float,
    item_gradient_maps=None,
    distillation=None,
    user_learning_rate: Optional[float] = None,
):
  """One SGD step of every user on `params[k]`, k in `keys`.

  Returns (params, per-user losses [U]). The users' losses depend on their
  own parameters only, so the gradient of their sum is each user's gradient.
  `item_gradient_maps` (float32 [U, d, d] or None): see the module docstring.
  `user_learning_rate`: the step of `user_embedding` (None: learning_rate).
  """
  rows = tf.gather(params['item_embedding'], batch_items, batch_dims=1)
  dense_keys = [k for k in keys if k != 'item_embedding']
  watched = [params[k] for k in dense_keys]
  with tf.GradientTape() as tape:
    tape.watch(watched)
    tape.watch(rows)
    losses = _user_batch_losses(
        spec, params, rows, batch_labels, mask, distillation
    )
    total = tf.reduce_sum(losses)
  dense_grads, row_grads = tape.gradient(total, (watched, rows))
  updated = dict(params)
  for key, value, grad in zip(dense_keys, watched, dense_grads):
    rate = learning_rate
    if key == 'user_embedding' and user_learning_rate is not None:
      rate = user_learning_rate
    updated[key] = tf.nest.map_structure(
        lambda v, g, rate=rate: v - rate * g, value, grad
    )
  if 'item_embedding' in keys:
    if item_gradient_maps is not None:
      row_grads = tf.einsum('ubd,ude->ube', row_grads, item_gradient_maps)
    num_users = tf.shape(batch_items)[0]
    user_index = tf.broadcast_to(
        tf.range(num_users)[:, None], tf.shape(batch_items)
    )
    updated['item_embedding'] = tf.tensor_scatter_nd_sub(
        params['item_embedding'],
        tf.stack([user_index, batch_items], axis=-1),
        item_learning_rate * row_grads,
    )
  return updated, losses


def _epoch_order(num_examples, max_examples, shuffle_seeds, epoch):
  """Each user's visiting order [U, N]: its own n_u examples, then padding.

  Epoch 0 keeps the given order; epoch e > 0 reshuffles user u's examples
  with the stateless seed shuffle_seeds[u] + e.
  """
  num_users = tf.shape(num_examples)[0]
  identity = tf.tile(tf.range(max_examples)[None], [num_users, 1])
  if tf.equal(epoch, 0):
    return identity

  def shuffle_one(args):
    count, seed = args
    shuffled = tf.random.experimental.stateless_shuffle(
        tf.range(count), seed=seed + tf.cast(epoch, tf.int64)
    )
    return tf.concat([shuffled, tf.range(count, max_examples)], axis=0)

  return tf.map_fn(
      shuffle_one,
      (num_examples, shuffle_seeds),
      fn_output_signature=tf.TensorSpec([None], tf.int32),
  )


@tf.function
def train_users_locally(
    spec: models.RecommenderSpec,
    params: models.Parameters,
    items: tf.Tensor,
    labels: tf.Tensor,
    num_examples: tf.Tensor,
    *,
    batch_size: int,
    local_epochs: int,
    learning_rate: float,
    item_learning_rate: float,
    alternating: bool,
    shuffle_seeds: tf.Tensor,
    item_gradient_maps: Optional[tf.Tensor] = None,
    distillation: Optional[Distillation] = None,
    first_keys: Optional[tuple[str, ...]] = None,
    user_learning_rate: Optional[float] = None,
) -> LocalTrainingResult:
  """Runs `local_epochs` epochs of minibatch SGD for U users at once.

  Args:
    spec: The model.
    params: Every user's parameters, each leaf with a leading [U] dimension;
      `item_embedding` [U, T, d] is each user's (compact) table.
    items: int32 [U, N], rows of the user's table; entries at positions
      >= num_examples[u] are padding (any valid row).
    labels: float32 [U, N].
    num_examples: int32 [U], n_u.
    batch_size, local_epochs, learning_rate, item_learning_rate, alternating:
      see the module docstring.
    shuffle_seeds: int64 [U, 2]; epoch e > 0 reshuffles with seed + e.
    item_gradient_maps: float32 [U, d, d] or None (the identity); user u's
      item-row gradients are multiplied by its map before every step.
    distillation: None, or a `Distillation` whose teacher logits [U, N]
      are aligned with `items`: every step's loss adds it (APFR-GKD Eq. 8).
    first_keys: With `alternating`, the parameters of the first step of
      each batch (default the client-local ones, PFedRec's lines 8-9); the
      second steps the others. APFR-GKD's Dual phase steps the user
      embedding and the shared score layers first, then the item rows.
    user_learning_rate: The SGD step of `user_embedding`; None means
      `learning_rate` (module docstring).

  Returns:
    `LocalTrainingResult(parameters, loss_sum [U], num_examples [U])`;
    loss_sum[u] sums (batch loss x batch size) of the last step taken on each
    of the user's batches over all epochs, num_examples[u] = n_u x epochs, so
    their ratio is the reference code's reported training loss.
  """
  params = dict(params)
  first_keys = spec.local_keys if first_keys is None else tuple(first_keys)
  second_keys = tuple(k for k in spec.keys if k not in first_keys)
  max_examples = tf.shape(items)[1]
  num_batches = (tf.reduce_max(num_examples) + batch_size - 1) // batch_size
  loss_sum = tf.zeros(tf.shape(num_examples), tf.float32)
  for epoch in tf.range(local_epochs):
    order = _epoch_order(num_examples, max_examples, shuffle_seeds, epoch)
    for batch in tf.range(num_batches):
      index = order[:, batch * batch_size : (batch + 1) * batch_size]
      mask = tf.cast(index < num_examples[:, None], tf.float32)
      batch_items = tf.gather(items, index, batch_dims=1)
      batch_labels = tf.gather(labels, index, batch_dims=1)
      batch_distillation = None
      if distillation is not None:
        batch_distillation = distillation._replace(
            teacher_logits=tf.gather(
                distillation.teacher_logits, index, batch_dims=1)
        )
      step = lambda params, keys: _sgd_step(
          spec, params, batch_items, batch_labels, mask, keys,
          learning_rate, item_learning_rate, item_gradient_maps,
          batch_distillation, user_learning_rate,
      )
      if alternating and first_keys:
        params, _ = step(params, first_keys)
        params, losses = step(params, second_keys)
      else:
        params, losses = step(params, spec.keys)
      loss_sum += losses * tf.reduce_sum(mask, axis=1)
  return LocalTrainingResult(
      parameters=collections.OrderedDict((k, params[k]) for k in spec.keys),
      loss_sum=loss_sum,
      num_examples=num_examples * local_epochs,
  )


def train_locally(
    spec: models.RecommenderSpec,
    params: models.Parameters,
    items: tf.Tensor,
    labels: tf.Tensor,
    *,
    batch_size: int,
    local_epochs: int,
    learning_rate: float,
    item_learning_rate: float,
    alternating: bool,
    shuffle_seed: tf.Tensor,
    item_gradient_map: Optional[tf.Tensor] = None,
    distillation: Optional[Distillation] = None,
    first_keys: Optional[tuple[str, ...]] = None,
    user_learning_rate: Optional[float] = None,
) -> LocalTrainingResult:
  """One client's local training: `train_users_locally` with U = 1.

  `params` are one user's (no leading dimension), `items` int32 [n] index its
  `item_embedding`, `labels` float32 [n], `shuffle_seed` int64 [2],
  `item_gradient_map` float32 [d, d] or None, `distillation` one user's
  (teacher logits [n], weight a scalar) or None. The first
  epoch visits the examples in the given order (the program shuffles them
  when it draws the round's negatives). Returns scalars `loss_sum` and
  `num_examples` (n x local_epochs).
  """
  add_user_dim = lambda t: tf.expand_dims(t, 0)
  result = train_users_locally(
      spec,
      tf.nest.map_structure(add_user_dim, params),
      add_user_dim(items),
      add_user_dim(labels),
      tf.shape(items)[:1],
      batch_size=batch_size,
      local_epochs=local_epochs,
      learning_rate=learning_rate,
      item_learning_rate=item_learning_rate,
      alternating=alternating,
      shuffle_seeds=add_user_dim(shuffle_seed),
      item_gradient_maps=(
          None if item_gradient_map is None
          else add_user_dim(item_gradient_map)
      ),
      distillation=(
          None if distillation is None
          else distillation._replace(
              teacher_logits=add_user_dim(distillation.teacher_logits),
              weights=add_user_dim(distillation.weights),
          )
      ),
      first_keys=first_keys,
      user_learning_rate=user_learning_rate,
  )
  return tf.nest.map_structure(lambda t: t[0], result)
