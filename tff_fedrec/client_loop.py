"""The one client loop: a group of users' minibatches, epoch after epoch.

Every method's local training is `for_each_user_batch(init, step,
finalize)` (fedjax's `for_each_client` for a group of U users trained at
once, `templates.user_groups`): the loop owns the order of each user's
examples in every epoch, the batches and their masks; the method owns what
a step does (its loss terms and its optimizer) and what it keeps.

User u's batch b of an epoch holds its own examples at positions b*B ..
(b+1)*B - 1 of that epoch's order; positions past its n_u real examples
are padding, masked out (`Batch.mask` 0) and pointing at a valid example,
so a user whose data has run out takes no step while the others finish.
Each user's result is therefore that of training it alone, whatever the
group. Two orders (`ORDERS`):

  'given_then_shuffled'  epoch 0 visits the examples as given (the program
                         shuffles them when it draws the round's
                         negatives); epoch e > 0 reshuffles user u's with
                         the stateless seed seeds[u] + e. An epoch is
                         ceil(max_u n_u / B) batches, the last one
                         narrower when no user fills it (PFedRec's
                         reference code, FedRAP's).
  'shuffled'             every epoch e (0-based) orders user u's examples
                         by `tf.random.stateless_uniform` keys seeded by
                         seeds[u] folded with e + 1, its real examples
                         first; an epoch is max(1, ceil(max_u n_u / B))
                         batches of exactly B (HeteFedRec's minibatch
                         Adam, after the first author's public code).

The real examples of a user are those its `example_mask` [U, N] weighs 1;
under 'given_then_shuffled' they must come first (a prefix), under
'shuffled' they may lie anywhere (HeteFedRec holds out a validation split).
With `batch_size` None each epoch is one step on all of every user's
examples, nothing gathered, the epochs unrolled when their number is a
Python int.

Example (the mean of each user's labels, one pass of batches of 2):
  >>> total = for_each_user_batch(
  ...     {'labels': labels}, mask, seeds=seeds, batch_size=2, epochs=1,
  ...     init=tf.zeros([num_users]),
  ...     step=lambda s, b: s + tf.reduce_sum(b.examples['labels'] * b.mask, 1),
  ...     finalize=lambda s: s / tf.reduce_sum(mask, 1))
"""

from typing import Callable, NamedTuple, Optional

import tensorflow as tf

ORDERS = ('given_then_shuffled', 'shuffled')


class Batch(NamedTuple):
  """One step's examples of every user of the group.

  Attributes:
    epoch: int32 [], 0-based.
    index: int32 [U, B], each user's example positions (into N); None when
      an epoch is one full step.
    mask: float32 [U, B], 1 for real examples, 0 for padding.
    examples: Each of the loop's `examples` gathered at `index`, [U, B, ...]
      (all of them, [U, N, ...], when an epoch is one full step).
  """

  epoch: tf.Tensor
  index: tf.Tensor
  mask: tf.Tensor
  examples: dict


def _given_then_shuffled(counts, max_examples, seeds, epoch, batch_size):
  """(order [U, N], batches): epoch 0 as given, later ones reshuffled."""
  num_users = tf.shape(counts)[0]
  num_batches = (tf.reduce_max(counts) + batch_size - 1) // batch_size

  def shuffle_one(args):
    count, seed = args
    shuffled = tf.random.experimental.stateless_shuffle(
        tf.range(count), seed=seed + tf.cast(epoch, tf.int64)
    )
    return tf.concat([shuffled, tf.range(count, max_examples)], axis=0)

  order = tf.cond(
      tf.equal(epoch, 0),
      lambda: tf.tile(tf.range(max_examples)[None], [num_users, 1]),
      lambda: tf.map_fn(
          shuffle_one, (counts, seeds),
          fn_output_signature=tf.TensorSpec([None], tf.int32),
      ),
  )
  return order, num_batches


def _shuffled(example_mask, seeds, epoch, batch_size):
  """(order [U, S B], S): keyed random order, real examples first."""
  num_examples = tf.shape(example_mask)[1]
  keys = tf.map_fn(
      lambda seed: tf.random.stateless_uniform(
          [num_examples],
          tf.random.experimental.stateless_fold_in(seed, epoch + 1),
      ),
      seeds, fn_output_signature=tf.float32,
  )
  order = tf.argsort(keys + 2.0 * (1.0 - example_mask), axis=1, stable=True)
  counts = tf.cast(tf.reduce_sum(example_mask, axis=1), tf.int32)
  steps = tf.maximum(1, -(-tf.reduce_max(counts) // batch_size))
  slots = steps * batch_size
  order = tf.pad(order, [[0, 0], [0, tf.maximum(0, slots - num_examples)]])
  return order[:, :slots], steps


def for_each_user_batch(
    examples: dict,
    example_mask: tf.Tensor,
    *,
    seeds: tf.Tensor,
    batch_size: Optional[int],
    epochs,
    init,
    step: Callable,
    end_epoch: Optional[Callable] = None,
    finalize: Optional[Callable] = None,
    order: str = 'given_then_shuffled',
):
  """Runs `epochs` epochs of `step` over every user's batches.

  Args:
    examples: {name: [U, N, ...]}, each user's examples (padded past its
      real ones).
    example_mask: float32 [U, N], 1 for each user's real examples.
    seeds: int64 [U, 2], each user's shuffle seed.
    batch_size: B, or None for one full-batch step per epoch.
    epochs: E, an int or int32 scalar.
    init: The loop's initial state, any nest of tensors.
    step: (state, `Batch`) -> state.
    end_epoch: (state, epoch int32) -> state after each epoch, or None.
    finalize: state -> result after the last epoch, or None (the state).
    order: One of `ORDERS` (module docstring).

  Returns:
    `finalize(state)`, or the state.
  """
  if order not in ORDERS:
    raise ValueError(f'order must be one of {ORDERS}; got {order!r}.')
  example_mask = tf.convert_to_tensor(example_mask, tf.float32)

  def run_epoch(epoch, state):
    if batch_size is None:
      state = step(state, Batch(epoch, None, example_mask, dict(examples)))
    else:
      counts = tf.cast(tf.reduce_sum(example_mask, axis=1), tf.int32)
      max_examples = tf.shape(example_mask)[1]
      if order == 'shuffled':
        epoch_order, num_batches = _shuffled(
            example_mask, seeds, epoch, batch_size)
      else:
        epoch_order, num_batches = _given_then_shuffled(
            counts, max_examples, seeds, epoch, batch_size)

      def run_batch(batch, state):
        positions = tf.range(batch * batch_size, (batch + 1) * batch_size)
        index = epoch_order[:, batch * batch_size : (batch + 1) * batch_size]
        positions = positions[: tf.shape(index)[1]]
        mask = tf.cast(positions[None, :] < counts[:, None], tf.float32)
        gathered = {name: tf.gather(value, index, batch_dims=1)
                    for name, value in examples.items()}
        return batch + 1, step(state, Batch(epoch, index, mask, gathered))

      _, state = tf.while_loop(
          lambda batch, _: batch < num_batches, run_batch,
          (tf.constant(0), state),
      )
    if end_epoch is not None:
      state = end_epoch(state, epoch)
    return epoch + 1, state

  if batch_size is None and isinstance(epochs, int):
    # Full-batch epochs run one after the other, with no loop around the
    # step: inside a tf.while_loop, All Large's round on ML-1M took 1.63 s
    # instead of 1.27 s (docs/results/hetefedrec.md, "A fifth reading").
    state = init
    for epoch in range(epochs):
      _, state = run_epoch(tf.constant(epoch), state)
  else:
    _, state = tf.while_loop(
        lambda epoch, _: epoch < epochs, run_epoch, (tf.constant(0), init),
    )
  return finalize(state) if finalize is not None else state
