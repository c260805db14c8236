"""Local SGD of the local-item methods' clients, as plain TF math (no `tff.*`).

Implements ClientUpdate of PFedRec's Algorithm 1 (Zhang et al., IJCAI 2023)
and the joint update of the FedMF / FedNCF / FedRecon baselines:

- `alternating=True` (dual personalization, Sec. 4.3): on every batch, first
  one SGD step on the client-local parameters with the item embedding fixed
  (lines 8-9), then the loss is computed again and one SGD step is taken on
  the item embedding and any global dense parameters (lines 10-11).
- `alternating=False`: one SGD step on all parameters per batch.

The loss is Eq. (7), the binary cross-entropy, averaged over the batch as the
reference code's `BCELoss` does, plus a method's own term if it has one
(`LossTerm`: APFR-GKD's distillation, `apfr_gkd.kd_loss`). The item
embedding has its own learning rate: the reference code uses lr * num_items
* 80 for it (docs/methods/pfedrec.md). The user embedding may have its own
too (`user_learning_rate`): every example of a batch reaches p_u while an
item row sees a few, so under the mean-reduced loss p_u's gradient is one
example's size and an item row's a B-th of it; at the shared rate p_u
barely moves (APFR-GKD, docs/results/apfr_gkd.md).

Item rows are updated sparsely: only the rows of the batch's items change
(duplicates accumulate, as PyTorch's embedding gradient does), in place
(`in_place_rows.RowTable`: a step does not copy the group's table). With
`item_gradient_maps` M_u [d, d], user u's row gradients G become G M_u
before the step: CoLR trains its low-rank update through the loss that way
(`fedras.compression.colr_gradient_map`).

`train_users_locally` trains U clients at once, each on its own copy of
every parameter (leading dimension [U]), through the one client loop
(`client_loop.for_each_user_batch`, order 'given_then_shuffled'), so each
user's result is that of training it alone (`train_locally`, the case
U = 1).
"""

import collections
from typing import Any, Callable, NamedTuple, Optional

import tensorflow as tf

from tff_fedrec import client_loop
from tff_fedrec import in_place_rows
from tff_fedrec import models

LocalTrainingResult = collections.namedtuple(
    'LocalTrainingResult', ['parameters', 'loss_sum', 'num_examples']
)


class LossTerm(NamedTuple):
  """A method's own term of each user's batch loss.

  Attributes:
    examples: {name: [U, N]}, per-example inputs of the term, aligned with
      `items` (gathered into each batch as the labels are).
    fn: (logits [U, B], `client_loop.Batch`) -> [U], the term of each user
      for the batch, added to its mean BCE.
  """

  examples: dict
  fn: Callable


def _user_batch_losses(spec, params, rows, batch, loss_term=None):
  """Per-user mean BCE (Eq. 7) over the user's real examples [U], plus
  the method's `loss_term` of the batch."""
  logits = models.logits_from_vectors(spec, params, rows)
  losses = tf.nn.sigmoid_cross_entropy_with_logits(
      labels=batch.examples['labels'], logits=logits)
  counts = tf.maximum(tf.reduce_sum(batch.mask, axis=1), 1.0)
  user_losses = tf.reduce_sum(losses * batch.mask, axis=1) / counts
  if loss_term is None:
    return user_losses
  return user_losses + loss_term.fn(logits, batch)


def _sgd_step(
    spec: models.RecommenderSpec,
    params: dict[str, Any],
    table: in_place_rows.RowTable,
    batch: client_loop.Batch,
    keys: tuple[str, ...],
    learning_rate: float,
    item_learning_rate: float,
    item_gradient_maps=None,
    loss_term=None,
    user_learning_rate: Optional[float] = None,
):
  """One SGD step of every user on `params[k]`, k in `keys`, and on the
  rows of `table` (the item embedding) if 'item_embedding' is in `keys`.

  Returns (params without the item embedding, per-user losses [U]); the
  item rows change in `table`. The users' losses depend on their own
  parameters only, so the gradient of their sum is each user's gradient.
  `item_gradient_maps` (float32 [U, d, d] or None): see the module docstring.
  `user_learning_rate`: the step of `user_embedding` (None: learning_rate).
  """
  batch_items = batch.examples['items']
  rows = table.gather(batch_items)
  dense_keys = [k for k in keys if k != 'item_embedding']
  watched = [params[k] for k in dense_keys]
  with tf.GradientTape() as tape:
    tape.watch(watched)
    tape.watch(rows)
    losses = _user_batch_losses(spec, params, rows, batch, loss_term)
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
    table.subtract(batch_items, item_learning_rate * row_grads)
  return updated, losses


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
    loss_term: Optional[LossTerm] = None,
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
    loss_term: None, or a method's `LossTerm`, added to every step's loss.
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
  first_keys = spec.local_keys if first_keys is None else tuple(first_keys)
  second_keys = tuple(k for k in spec.keys if k not in first_keys)
  examples = {'items': items, 'labels': labels,
              **(loss_term.examples if loss_term is not None else {})}

  table = in_place_rows.RowTable(params['item_embedding'])
  dense_keys = tuple(k for k in spec.keys if k != 'item_embedding')

  def step(state, batch):
    params, loss_sum = state
    take = lambda params, keys: _sgd_step(
        spec, params, table, batch, keys, learning_rate, item_learning_rate,
        item_gradient_maps, loss_term, user_learning_rate,
    )
    if alternating and first_keys:
      params, _ = take(params, first_keys)
      params, losses = take(params, second_keys)
    else:
      params, losses = take(params, spec.keys)
    return params, loss_sum + losses * tf.reduce_sum(batch.mask, axis=1)

  params, loss_sum = client_loop.for_each_user_batch(
      examples,
      tf.sequence_mask(num_examples, tf.shape(items)[1], tf.float32),
      seeds=shuffle_seeds,
      batch_size=batch_size,
      epochs=local_epochs,
      init=({k: params[k] for k in dense_keys},
            tf.zeros(tf.shape(num_examples), tf.float32)),
      step=step,
  )
  params = dict(params, item_embedding=table.read())
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
    loss_term: Optional[LossTerm] = None,
    first_keys: Optional[tuple[str, ...]] = None,
    user_learning_rate: Optional[float] = None,
) -> LocalTrainingResult:
  """One client's local training: `train_users_locally` with U = 1.

  `params` are one user's (no leading dimension), `items` int32 [n] index its
  `item_embedding`, `labels` float32 [n], `shuffle_seed` int64 [2],
  `item_gradient_map` float32 [d, d] or None, `loss_term` one user's
  (its examples [n], its fn of [1, B] logits) or None. The first
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
      loss_term=(
          None if loss_term is None
          else loss_term._replace(examples=tf.nest.map_structure(
              add_user_dim, loss_term.examples))
      ),
      first_keys=first_keys,
      user_learning_rate=user_learning_rate,
  )
  return tf.nest.map_structure(lambda t: t[0], result)
