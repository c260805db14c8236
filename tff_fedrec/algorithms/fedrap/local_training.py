"""FedRAP's local training of many users at once, as plain TF math.

One user's round in the reference code (mtics/FedRAP at d6ee2ac): a new
`torch.optim.SGD` with two parameter groups, the affine layer at
lr_network and the item tables D^(i) and C at lr_args (both already
multiplied by decay_rate^round), weight decay wd on every parameter, and an
`ExponentialLR(gamma)` stepped after every batch; `local_epochs` epochs of
minibatches of the loss of `losses.batch_losses`. So user u's k-th step of
round r (k = 0, 1, ... over all its epochs) is, for each parameter p with
learning rate lr,

  p <- p - lr_k (grad_p + wd p),   lr_k = lr decay_rate^r gamma^k.

Weight decay reaches every row of D^(i) and C, also those not in the batch
(PyTorch's embedding gradient is dense). Here a user trains a compact table
of the T rows of the items in its round's data; every row outside it only
decays, by the same factor at every step, so their product over the round,
`round_row_scale` = prod_k (1 - lr_args_k wd), tells what happened to all
of them: the program scales the user's other rows of D^(i) by it
(`client_state`), and its upload of C carries it (`process`).

Users are vectorised by the one client loop
(`client_loop.for_each_user_batch`, order 'given_then_shuffled'): leading
dimension [U], user u's batch b holds its own examples b*B .. (b+1)*B - 1
of the epoch's order, padding is masked, and a user whose data has run out
takes no step at all (no decay, no scheduler step). Early stopping on the
relative change of the running loss (the reference's tol = 1e-4) is left
out: every user runs all its epochs.
"""

import collections
import dataclasses

import tensorflow as tf

from tff_fedrec import client_loop
from tff_fedrec import scoring
from tff_fedrec.algorithms.fedrap import losses


@dataclasses.dataclass(frozen=True)
class FedRAPTrainingConfig:
  """FedRAP's local training (the reference code's defaults at d6ee2ac).

  Attributes:
    learning_rate: lr_network, SGD step of the affine layer.
    item_learning_rate: lr_args, SGD step of the rows of D^(i) and C.
    batch_size: Minibatch size B.
    local_epochs: Local epochs E.
    weight_decay: l2_regularization, SGD weight decay of every parameter.
    batch_lr_decay: gamma of the per-batch ExponentialLR (restarts each
      round: the optimizer is made anew).
    round_lr_decay: decay_rate; round r trains at the learning rates times
      decay_rate^r.
    lam: lambda, weight of -MSE(D, C) (`losses`).
    mu: mu, weight of the L1 norm of C.
    weight_schedule: 'fixed' (the code) or 'tanh' (the paper's curriculum),
      `losses.regularization_weights`.
  """

  learning_rate: float = 0.5
  item_learning_rate: float = 200.0
  batch_size: int = 2048
  local_epochs: int = 10
  weight_decay: float = 1e-4
  batch_lr_decay: float = 0.95
  round_lr_decay: float = 0.97
  lam: float = 0.1
  mu: float = 0.1
  weight_schedule: str = 'fixed'

  def __post_init__(self):
    for name in ('batch_size', 'local_epochs'):
      if getattr(self, name) < 1:
        raise ValueError(f'{name} must be at least 1; got '
                         f'{getattr(self, name)}.')
    if self.weight_schedule not in losses.WEIGHT_SCHEDULES:
      raise ValueError(
          f'weight_schedule must be one of {losses.WEIGHT_SCHEDULES}; got '
          f'{self.weight_schedule!r}.'
      )


LocalTrainingResult = collections.namedtuple(
    'LocalTrainingResult',
    ['personal_rows', 'global_rows', 'score_layers', 'round_row_scale',
     'loss_sum', 'num_examples'],
)


def _layers(score_layers):
  return [(layer['kernel'], layer['bias']) for layer in score_layers]


def _scatter_rows(table, batch_items, row_grads, learning_rate, decay):
  """table [U, T, d] times decay [U], minus learning_rate [U] x the row
  gradients [U, B, d] added at their rows (duplicates accumulate)."""
  num_users = tf.shape(batch_items)[0]
  user_index = tf.broadcast_to(
      tf.range(num_users)[:, None], tf.shape(batch_items)
  )
  return tf.tensor_scatter_nd_sub(
      table * decay[:, None, None],
      tf.stack([user_index, batch_items], axis=-1),
      learning_rate[:, None, None] * row_grads,
  )


@tf.function
def train_users_locally(
    personal_rows: tf.Tensor,
    global_rows: tf.Tensor,
    score_layers,
    items: tf.Tensor,
    labels: tf.Tensor,
    num_examples: tf.Tensor,
    *,
    round_num,
    shuffle_seeds: tf.Tensor,
    config: FedRAPTrainingConfig,
) -> LocalTrainingResult:
  """Round `round_num` of local SGD for U users (module docstring).

  Args:
    personal_rows: float32 [U, T, d], the user's rows of D^(i) for its
      compact table.
    global_rows: float32 [U, T, d], the same rows of the server's C.
    score_layers: The users' affine layer, `[OrderedDict(kernel [U, d, 1],
      bias [U, 1])]`.
    items: int32 [U, N], each example's row of the compact table; entries
      at positions >= num_examples[u] are padding (any valid row).
    labels: float32 [U, N].
    num_examples: int32 [U], n_u.
    round_num: r, 0-based (learning rates and the weight schedule).
    shuffle_seeds: int64 [U, 2]; epoch e > 0 reshuffles with seed + e.
    config: The hyperparameters.

  Returns:
    `LocalTrainingResult`: the trained rows of D^(i) and C [U, T, d], the
    affine layers, round_row_scale [U] (what every row outside the compact
    table was multiplied by), and loss_sum [U] (batch loss x batch size,
    summed over the user's steps) and num_examples [U] (n_u x epochs).
  """
  lam, mu = losses.regularization_weights(
      config.lam, config.mu, round_num, config.weight_schedule
  )
  round_scale = tf.pow(
      tf.constant(config.round_lr_decay, tf.float32),
      tf.cast(round_num, tf.float32),
  )
  wd = config.weight_decay
  num_users = tf.shape(num_examples)[0]

  def step(state, batch):
    score_layers, personal_rows, global_rows, loss_sum, steps, row_scale = (
        state)
    batch_items = batch.examples['items']
    personal = tf.gather(personal_rows, batch_items, batch_dims=1)
    shared = tf.gather(global_rows, batch_items, batch_dims=1)
    watched = [score_layers, personal, shared]
    with tf.GradientTape() as tape:
      tape.watch(watched)
      logits = scoring.score_function_logits(
          personal + shared, _layers(score_layers)
      )
      user_losses = losses.batch_losses(
          logits, batch.examples['labels'], personal, shared, batch.mask,
          lam=lam, mu=mu,
      )
      total = tf.reduce_sum(user_losses)
    layer_grads, personal_grads, shared_grads = tape.gradient(total, watched)
    # Users without a real example this batch take no step.
    steps_here = tf.cast(tf.reduce_sum(batch.mask, axis=1) > 0, tf.float32)
    lr_scale = steps_here * round_scale * tf.pow(
        tf.constant(config.batch_lr_decay, tf.float32), steps
    )
    network_lr = config.learning_rate * lr_scale
    item_lr = config.item_learning_rate * lr_scale
    item_decay = 1.0 - item_lr * wd
    score_layers = tf.nest.map_structure(
        lambda value, grad: value - tf.reshape(
            network_lr, [-1] + [1] * (value.shape.rank - 1)
        ) * (grad + wd * value),
        score_layers, layer_grads,
    )
    return (
        score_layers,
        _scatter_rows(personal_rows, batch_items, personal_grads, item_lr,
                      item_decay),
        _scatter_rows(global_rows, batch_items, shared_grads, item_lr,
                      item_decay),
        loss_sum + user_losses * tf.reduce_sum(batch.mask, axis=1),
        steps + steps_here,
        row_scale * item_decay,
    )

  score_layers, personal_rows, global_rows, loss_sum, _, row_scale = (
      client_loop.for_each_user_batch(
          {'items': items, 'labels': labels},
          tf.sequence_mask(num_examples, tf.shape(items)[1], tf.float32),
          seeds=shuffle_seeds,
          batch_size=config.batch_size,
          epochs=config.local_epochs,
          init=(tf.nest.map_structure(tf.identity, score_layers),
                personal_rows, global_rows,
                tf.zeros([num_users], tf.float32),
                tf.zeros([num_users], tf.float32),
                tf.ones([num_users], tf.float32)),
          step=step,
      ))
  return LocalTrainingResult(
      personal_rows=personal_rows,
      global_rows=global_rows,
      score_layers=score_layers,
      round_row_scale=row_scale,
      loss_sum=loss_sum,
      num_examples=num_examples * config.local_epochs,
  )
