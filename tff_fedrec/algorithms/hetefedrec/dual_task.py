"""A HeteFedRec client's update: unified dual-task learning with decorrelation.

For a client of tier a (Yuan et al., ICDE 2024, Sec. IV.B), with its private
u_i [N_a], the rows of V_a for the items in its data and the scorers
Theta_b of every tier b <= a:

- Eq. 2: L(u, V, Theta) = sum over the client's examples of the binary
  cross-entropy of sigmoid(FFN_Theta([u ; v_j])) against r_ij (for
  Fed-LightGCN, u propagated on the local graph first,
  `hetero_models.user_representation`).
- Eq. 11 (unified dual-task learning, UDL): L_a = sum_{b <= a}
  L(u[:N_b], V_a[:, :N_b], Theta_b); without UDL only the b = a term.
- Eq. 14 (dimensional decorrelation, DDR): L'_a = L_a + alpha L_reg(V_a)
  for the medium and large tiers, L_reg of Eq. 13
  (`decorrelation.decorrelation_loss`) taken over the rows of the items in
  the client's data, the part of V_a its update touches.

Algorithm 1 (lines 16-26) computes one gradient per round on the client's
whole data: of u_i (updated on the device, Eq. 3), of V_a and of each
Theta_b (uploaded). `client_gradients` does this for U clients of one tier at
once: the clients' losses are independent, so the gradient of their sum is
each client's gradient for u and the sum of the clients' gradients for the
public parameters, which the server sums anyway (Eq. 8, Eq. 15).
`local_adam_changes` is the alternative of Sec. III.A: several local Adam
steps on each client's own copy of the parameters, uploading the change.
"""

import collections
from typing import NamedTuple

import tensorflow as tf

from tff_fedrec import adam
from tff_fedrec import client_loop
from tff_fedrec.algorithms.hetefedrec import decorrelation
from tff_fedrec.algorithms.hetefedrec import models as hetero_models


class TierObjective(NamedTuple):
  """Which L'_a (Eq. 14) a group of clients of one tier trains."""

  spec: hetero_models.HeteroSpec  # The tiers' sizes and base model.
  tier: int  # a: 0 (small), 1 (medium) or 2 (large).
  # Eq. 11's UDL; False trains Theta_a on the full width only.
  dual_task: bool
  decorrelation_weight: float  # alpha of Eq. 14 (used for tiers 1 and 2).


class ClientExamples(NamedTuple):
  """U clients' examples in the padded layout of `user_groups`."""

  row_mask: tf.Tensor  # [U, T] 1 for each client's real rows.
  items: tf.Tensor  # int32 [U, n] each example's row among the client's.
  labels: tf.Tensor  # [U, n] r_ij in {0, 1}.
  example_mask: tf.Tensor  # [U, n] 1 for the examples the loss counts.


ClientLosses = collections.namedtuple('ClientLosses', ['total', 'own_tier'])
ClientGradients = collections.namedtuple(
    'ClientGradients',
    ['user', 'item_rows', 'score_layers', 'loss_sum', 'num_examples'],
)


def tier_terms(tier: int, dual_task: bool) -> tuple[int, ...]:
  """The tiers b whose scorer enters L_a (Eq. 11)."""
  return tuple(range(tier + 1)) if dual_task else (tier,)


def client_losses(
    objective: TierObjective,
    user: tf.Tensor,
    rows: tf.Tensor,
    score_layers,
    examples: ClientExamples,
    *,
    neighbors: tf.Tensor | None = None,
    decorrelate_batch_rows: bool = False,
) -> ClientLosses:
  """L'_a of Eq. 14 for U clients of tier a = `objective.tier`.

  Returns `ClientLosses(total [U], own_tier [U])`: L'_a, and its Eq. 2 term
  under the client's own scorer Theta_a (what the round reports as its
  training loss).

  Args:
    objective: The tier a and the terms of its L'_a.
    user: [U, N_a] private embeddings.
    rows: [U, T, N_a] each client's rows of V_a (its items, padded).
    score_layers: Theta_b for every b in L_a, indexed by tier: (Theta_s,
      Theta_m, Theta_l), lists of {kernel, bias}; a kernel [U, f_in, f_out]
      and bias [U, f_out] give each client its own scorer (`standalone`).
    examples: The clients' examples; `examples.items` index `rows`.
    neighbors: Fed-LightGCN only: [U, T] 1 for the rows of each client's
      local graph; by default `local_graph` of these examples.
    decorrelate_batch_rows: Eq. 13 over the rows of these examples' items,
      each once (`distinct_rows`; a minibatch's), instead of over all the
      real rows of `examples.row_mask`.
  """
  spec, tier = objective.spec, objective.tier
  vectors = tf.gather(rows, examples.items, batch_dims=1)
  if spec.model != 'ncf':
    if neighbors is None:
      neighbors = local_graph(examples)
    user = hetero_models.user_representation(
        spec, user, tf.einsum('ut,utn->un', neighbors, rows),
        tf.reduce_sum(neighbors, axis=1),
    )
  total = tf.zeros(tf.shape(user)[:1])
  for term in tier_terms(tier, objective.dual_task):
    width = spec.widths[term]
    term_logits = hetero_models.logits(
        user[:, :width], vectors[..., :width], score_layers[term]
    )
    losses = tf.nn.sigmoid_cross_entropy_with_logits(
        labels=examples.labels, logits=term_logits
    )
    term_loss = tf.reduce_sum(losses * examples.example_mask, axis=1)
    if term == tier:
      own_tier = term_loss
    total += term_loss
  if tier > 0 and objective.decorrelation_weight:
    regularized, regularized_mask = rows, examples.row_mask
    if decorrelate_batch_rows:
      indices, regularized_mask = distinct_rows(examples.items,
                                                examples.example_mask)
      regularized = tf.gather(rows, indices, batch_dims=1)
    total += (objective.decorrelation_weight
              * decorrelation.decorrelation_loss(regularized,
                                                 regularized_mask))
  return ClientLosses(total=total, own_tier=own_tier)


def local_graph(examples: ClientExamples) -> tf.Tensor:
  """Fed-LightGCN's local graph of U clients: [U, T] 1 for the rows of the
  items with a positive example."""
  return _rows_of(examples.items, examples.labels * examples.example_mask,
                  examples.row_mask)


def distinct_rows(items, example_mask) -> tuple[tf.Tensor, tf.Tensor]:
  """Each client's distinct rows among its examples, for Eq. 13 of a batch.

  Returns (indices int32 [U, n], mask float32 [U, n]): `items` [U, n] sorted
  per client, with mask 1 on the first of each distinct item among the
  examples `example_mask` weighs above 0 (negatives are drawn with
  replacement, so an item can recur in a batch) and 0 elsewhere. Eq. 13
  over `rows` gathered at these indices and weighed by this mask is Eq. 13
  over the [U, T] rows masked to the batch's items (it ignores the order of
  rows), at the cost of the batch's n rows rather than all T of the
  client's: taking all T rows on every batch made HeteFedRec's round on
  ML-1M take 11.6 s instead of 7.35 s (docs/results/hetefedrec.md, "A fifth reading").
  """
  unused = tf.int32.max
  keyed = tf.sort(tf.where(example_mask > 0, items, unused), axis=1)
  real = keyed < unused
  first = tf.concat(
      [tf.ones_like(real[:, :1]), tf.not_equal(keyed[:, 1:], keyed[:, :-1])],
      axis=1,
  )
  return (tf.where(real, keyed, 0),
          tf.cast(tf.logical_and(real, first), tf.float32))


def client_gradients(
    objective: TierObjective,
    user: tf.Tensor,
    rows: tf.Tensor,
    score_layers,
    examples: ClientExamples,
    *,
    neighbors: tf.Tensor | None = None,
    decorrelate_batch_rows: bool = False,
) -> ClientGradients:
  """Gradients of sum_i L'_{a,i} (see `client_losses` for the arguments).

  Returns `ClientGradients(user [U, N_a], item_rows [U, T, N_a],
  score_layers (3 tiers; zeros for tiers not in L_a), loss_sum, num_examples)`
  where loss_sum is the Eq. 2 part summed over the clients' examples, for
  reporting.
  """
  with tf.GradientTape() as tape:
    tape.watch([user, rows, score_layers])
    losses = client_losses(
        objective, user, rows, score_layers, examples, neighbors=neighbors,
        decorrelate_batch_rows=decorrelate_batch_rows,
    )
    total = tf.reduce_sum(losses.total)
  user_grad, row_grads, layer_grads = tape.gradient(
      total, (user, rows, score_layers),
      unconnected_gradients=tf.UnconnectedGradients.ZERO,
  )
  return ClientGradients(
      user=user_grad,
      item_rows=row_grads,
      score_layers=layer_grads,
      loss_sum=tf.reduce_sum(losses.own_tier),
      num_examples=tf.reduce_sum(examples.example_mask),
  )


ClientChanges = collections.namedtuple(
    'ClientChanges',
    ['user', 'item_rows', 'score_layers', 'loss_sum', 'num_examples',
     'kept_epoch'],
)


def local_adam_changes(
    objective: TierObjective,
    user: tf.Tensor,
    rows: tf.Tensor,
    score_layers,
    examples: ClientExamples,
    *,
    learning_rate: float,
    local_epochs: int,
    validation_mask: tf.Tensor | None = None,
    batch_size: int = 0,
    seeds: tf.Tensor | None = None,
    sum_score_layers: bool = True,
) -> ClientChanges:
  """Local training of Sec. III.A, the FedRec protocol HeteFedRec builds on.

  Each of the U clients trains its own copy of (u_i, its rows of V_a, every
  Theta_b) on L'_a (Eq. 14) for `local_epochs` epochs of Adam (Sec. V.D)
  started afresh from zero moments at the downloaded parameters, as a
  client that holds no optimizer state between rounds does. It keeps its
  new u_i (Eq. 3's private update) and uploads the change of the public
  parameters written as a descent direction, d_i = x_0 - x_L, so that the
  server's step of Eq. 4 / 8 / 9 / 15, V <- V - sum_i d_i, applies the
  clients' own steps summed. With one full-batch epoch a fresh Adam step is
  lr * g / (|g| + eps) per coordinate.

  An epoch is one full-batch step (`batch_size` 0), or with `batch_size` B
  a pass over the client's training examples in a fresh random order in
  steps of B examples (the last one fewer), each on L'_a of its batch with
  Eq. 13 taken over the rows of the batch's items (`distinct_rows`), as
  minibatch training (batch 64 or 256 in the first author's public FedRec
  code) does. Client
  i's order in epoch e is that of `tf.random.stateless_uniform` keys
  seeded by its seeds[i] folded with e, so it does not depend on the
  other clients of its group; a client whose examples are used up takes
  no step while the others finish (`adam.apply_per_client`). Fed-LightGCN
  propagates u_i over the client's whole local graph in every batch.

  With a `validation_mask` [U, n] (1 for the examples a client holds out,
  which `examples.example_mask` then excludes), the validation split guides the
  local training as Sec. V.A says 10% of a selected client's training
  data does: after each epoch the client measures its Eq. 2 loss under its
  own scorer Theta_a on the held-out examples, and it keeps the parameters
  of its best epoch of 1..L (early stopping; ties go to the later epoch,
  so a client without held-out examples keeps epoch L).

  Arguments as in `client_losses`, except that `score_layers` holds the
  shared Theta_b (kernels [f_in, f_out]) of all three tiers, which each
  client copies, and `seeds` int64 [U, 2] (needed with a `batch_size`).
  Returns `ClientChanges(user [U, N_a] (the new embeddings), item_rows
  [U, T, N_a] (d of each client's rows), score_layers (d of each Theta_b
  summed over the clients, or per client [U, ...] without
  `sum_score_layers`; zeros for tiers not in L'_a), loss_sum,
  num_examples, kept_epoch [U])`; loss_sum is the Eq. 2 part summed over
  the first epoch's steps (full batch: at the downloaded parameters), for
  reporting; kept_epoch is the epoch of 1..L each client keeps (L without
  a validation split).
  """
  if batch_size and seeds is None:
    raise ValueError('Minibatch local training needs the clients\' seeds.')
  num_users = tf.shape(user)[0]
  per_client = lambda x: tf.broadcast_to(
      x, tf.concat([[num_users], tf.shape(x)], 0)
  )
  start = (user, rows, tf.nest.map_structure(per_client, score_layers))
  neighbors = (None if objective.spec.model == 'ncf' else
               local_graph(examples))

  def step(carry, batch):
    params, state, epoch_loss, loss_sum, best, best_loss, kept_epoch = carry
    grads = client_gradients(
        objective, params[0], params[1], params[2],
        examples._replace(items=batch.examples['items'],
                          labels=batch.examples['labels'],
                          example_mask=batch.mask),
        neighbors=neighbors, decorrelate_batch_rows=bool(batch_size),
    )
    params, state = adam.apply_per_client(
        params, (grads.user, grads.item_rows, grads.score_layers), state,
        tf.reduce_any(batch.mask > 0, axis=1), learning_rate=learning_rate,
    )
    return (params, state, epoch_loss + grads.loss_sum, loss_sum, best,
            best_loss, kept_epoch)

  def end_epoch(carry, epoch):
    params, state, epoch_loss, loss_sum, best, best_loss, kept_epoch = carry
    # The first epoch's Eq. 2 part is the round's reported loss.
    loss_sum = tf.where(tf.equal(epoch, 0), epoch_loss, loss_sum)
    if validation_mask is not None:
      # Only the own-tier Eq. 2 term is compared: the other terms of
      # L'_a would be computed and dropped.
      (best, kept_epoch), best_loss = _keep_best_epoch(
          (best, kept_epoch), best_loss,
          (params, tf.fill([num_users], tf.cast(epoch + 1, tf.float32))),
          client_losses(
              objective._replace(dual_task=False, decorrelation_weight=0.0),
              *params, examples._replace(example_mask=validation_mask),
              neighbors=neighbors,
          ).own_tier,
      )
    return (params, state, tf.constant(0.0), loss_sum, best, best_loss,
            kept_epoch)

  params, _, _, loss_sum, best, _, kept_epoch = (
      client_loop.for_each_user_batch(
          {'items': examples.items, 'labels': examples.labels},
          examples.example_mask,
          seeds=seeds,
          # One full-batch step per epoch, nothing gathered, or minibatches
          # in a fresh random order every epoch.
          batch_size=batch_size or None,
          epochs=local_epochs,
          init=(start, adam.initial_state(start)._replace(
                    step=tf.zeros([num_users])),
                tf.constant(0.0), tf.constant(0.0), start,
                tf.fill([num_users], float('inf')),
                tf.fill([num_users], float(local_epochs))),
          step=step,
          end_epoch=end_epoch,
          order='shuffled',
      ))
  if validation_mask is not None:
    params = best
  changes = tf.nest.map_structure(tf.subtract, start, params)
  return ClientChanges(
      user=params[0],
      item_rows=changes[1],
      score_layers=(tf.nest.map_structure(
          lambda d: tf.reduce_sum(d, axis=0), changes[2]
      ) if sum_score_layers else changes[2]),
      loss_sum=loss_sum,
      num_examples=tf.reduce_sum(examples.example_mask),
      kept_epoch=kept_epoch,
  )


def _rows_of(items, example_mask, row_mask):
  """[U, T] 1 for the real rows (`row_mask`) of the examples of `items`
  [U, n] that `example_mask` [U, n] weighs above 0."""
  num_users = tf.shape(items)[0]
  user_index = tf.broadcast_to(tf.range(num_users)[:, None], tf.shape(items))
  used = tf.scatter_nd(
      tf.stack([user_index, items], -1), example_mask, tf.shape(row_mask)
  )
  return tf.cast(used > 0, row_mask.dtype) * row_mask


def _keep_best_epoch(best, best_loss, params, loss):
  """Each client's parameters of lowest validation `loss` [U] so far (the
  newer on ties; `best_loss` starts at +inf); every leaf of `params` has
  the clients first."""
  newer = loss <= best_loss

  def choose(new, old):
    mask = tf.reshape(newer, tf.concat(
        [tf.shape(newer), tf.ones([tf.rank(new) - 1], tf.int32)], 0))
    return tf.where(mask, new, old)

  return (tf.nest.map_structure(choose, params, best),
          tf.where(newer, loss, best_loss))
