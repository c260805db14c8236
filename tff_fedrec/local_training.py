"""One client's local training, as plain TF math (no `tff.*`).

Implements ClientUpdate of PFedRec's Algorithm 1 (Zhang et al., IJCAI 2023)
and the joint update of the FedMF / FedNCF / FedRecon baselines:

- `alternating=True` (dual personalization, Sec. 4.3): on every batch, first
  one SGD step on the client-local parameters with the item embedding fixed
  (lines 8-9), then the loss is computed again and one SGD step is taken on
  the item embedding and any global dense parameters (lines 10-11).
- `alternating=False`: one SGD step on all parameters per batch.

The loss is Eq. (7), the binary cross-entropy, averaged over the batch as the
reference code's `BCELoss` does. The item embedding has its own learning rate:
the reference code uses lr * num_items * 80 for it (see the README).

Item rows are updated sparsely: only the rows of the batch's items change
(duplicates accumulate, as PyTorch's embedding gradient does).

Shapes: `items` int32 [n], `labels` float32 [n], `item_embedding` [I, d].
"""

import collections
from typing import Any

import tensorflow as tf

from tff_fedrec import models

LocalTrainingResult = collections.namedtuple(
    'LocalTrainingResult', ['parameters', 'loss_sum', 'num_examples']
)


def _batch_loss(spec, params, rows, labels):
  batch_logits = models.logits_from_vectors(spec, params, rows)
  return tf.reduce_mean(
      tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=batch_logits)
  )


def _sgd_step(
    spec: models.RecommenderSpec,
    params: dict[str, Any],
    batch_items: tf.Tensor,
    batch_labels: tf.Tensor,
    keys: tuple[str, ...],
    learning_rate: float,
    item_learning_rate: float,
):
  """One SGD step on `params[k]` for k in `keys`; returns (params, loss)."""
  rows = tf.gather(params['item_embedding'], batch_items)
  dense_keys = [k for k in keys if k != 'item_embedding']
  watched = [params[k] for k in dense_keys]
  with tf.GradientTape() as tape:
    tape.watch(watched)
    tape.watch(rows)
    loss = _batch_loss(spec, params, rows, batch_labels)
  dense_grads, row_grads = tape.gradient(loss, (watched, rows))
  updated = dict(params)
  for key, value, grad in zip(dense_keys, watched, dense_grads):
    updated[key] = tf.nest.map_structure(
        lambda v, g: v - learning_rate * g, value, grad
    )
  if 'item_embedding' in keys:
    updated['item_embedding'] = tf.tensor_scatter_nd_sub(
        params['item_embedding'],
        tf.expand_dims(batch_items, 1),
        item_learning_rate * row_grads,
    )
  return updated, loss


@tf.function
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
) -> LocalTrainingResult:
  """Runs `local_epochs` epochs of minibatch SGD over one client's examples.

  The first epoch visits the examples in the given order (the program shuffles
  them when it draws the round's negatives); later epochs reshuffle with the
  stateless seed `shuffle_seed` (int64 [2]) so the run is reproducible.

  Returns:
    `LocalTrainingResult(parameters, loss_sum, num_examples)`; `loss_sum` is
    the sum over all batches of all epochs of (batch loss x batch size) of the
    last step taken on each batch, and `num_examples` counts the examples
    visited (n x local_epochs), so their ratio is the reference code's
    reported training loss.
  """
  params = dict(params)
  local_keys = spec.local_keys
  all_keys = spec.keys
  num_examples = tf.shape(items)[0]
  num_batches = (num_examples + batch_size - 1) // batch_size
  loss_sum = tf.constant(0.0)
  for epoch in tf.range(local_epochs):
    # tf.equal, not ==: TFF traces this into a TF1 graph, where Tensor.__eq__
    # is Python identity and the branch would be decided at trace time.
    if tf.equal(epoch, 0):
      order = tf.range(num_examples)
    else:
      order = tf.random.experimental.stateless_shuffle(
          tf.range(num_examples),
          seed=shuffle_seed + tf.cast(epoch, tf.int64),
      )
    for batch in tf.range(num_batches):
      index = order[batch * batch_size : (batch + 1) * batch_size]
      batch_items = tf.gather(items, index)
      batch_labels = tf.gather(labels, index)
      if alternating and local_keys:
        params, _ = _sgd_step(
            spec, params, batch_items, batch_labels, local_keys,
            learning_rate, item_learning_rate,
        )
        params, loss = _sgd_step(
            spec, params, batch_items, batch_labels, spec.global_keys,
            learning_rate, item_learning_rate,
        )
      else:
        params, loss = _sgd_step(
            spec, params, batch_items, batch_labels, all_keys,
            learning_rate, item_learning_rate,
        )
      loss_sum += loss * tf.cast(tf.shape(batch_items)[0], tf.float32)
  return LocalTrainingResult(
      parameters=collections.OrderedDict((k, params[k]) for k in spec.keys),
      loss_sum=loss_sum,
      num_examples=num_examples * local_epochs,
  )
