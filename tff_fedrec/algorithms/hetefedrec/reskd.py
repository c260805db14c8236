"""Relation-based ensemble self-distillation (HeteFedRec, Yuan et al. 2024).

HeteFedRec Sec. IV.C: after aggregating the tiers' item tables V_s, V_m, V_l
(of widths N_s < N_m < N_l), the server draws a random subset of items V_kd
and pulls each table's item-item cosine similarities on V_kd towards their
mean over the tables:

  d_ens(V_kd) = 1/3 sum_{a in {s, m, l}} d(V_a, V_kd)           (Eq. 16)
  L_kd(V)     = ||d(V, V_kd) - d_ens(V_kd)||_2^2                 (Eq. 17)

with d the cosine similarity matrix of the selected items. The idea is that
well-trained tables of any width should agree on which items are alike, so
the tables exchange knowledge without a public reference data set.
`WithEnsembleDistillation` runs it as the server's step after another
finalizer (`templates.finalizers.ServerAdam` or `SubtractChanges`).

The paper does not say how L_kd is minimised; here it is gradient descent
with the caller's learning rate and number of steps, on the rows of V_kd
only, with d_ens held fixed. `step_rule='gradient'` steps by lr * g.
`step_rule='adam'` steps by lr * g / (|g| + eps), the first step of a fresh
Adam (the paper trains with Adam, Sec. V.D): the gradient of a cosine scales
with 1 / |v|, so a plain step that suits trained rows throws the small rows
of a young table far past the target.
"""

import collections
from collections.abc import Sequence
from typing import NamedTuple

import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec.templates import finalizers


class DistillationResult(NamedTuple):
  """The tables after distillation and each table's L_kd before and after.

  Attributes:
    tables: list of float32 [I, N_a], the distilled tables, in input order.
    loss_before: list of float32 scalars, L_kd (Eq. 17) of each input table.
    loss_after: list of float32 scalars, L_kd of each distilled table, against
      the same d_ens.
  """

  tables: list[tf.Tensor]
  loss_before: list[tf.Tensor]
  loss_after: list[tf.Tensor]


def cosine_similarity_matrix(vectors: tf.Tensor) -> tf.Tensor:
  """Pairwise cosine similarities, HeteFedRec's d(V, V_kd) in Eq. 16-17.

  cos_ij = <v_i, v_j> / (|v_i| |v_j|). A zero vector has similarity 0 with
  every vector, itself included, and a finite gradient (`tf.math.
  l2_normalize` leaves it 0 instead of dividing by 0).

  Args:
    vectors: float32 [K, N], one vector per row.

  Returns:
    float32 [K, K], symmetric, in [-1, 1].
  """
  unit = tf.math.l2_normalize(tf.convert_to_tensor(vectors, tf.float32), -1)
  return tf.matmul(unit, unit, transpose_b=True)


def ensemble_similarity(
    tables: Sequence[tf.Tensor], item_ids: tf.Tensor
) -> tf.Tensor:
  """The ensemble similarity d_ens(V_kd), HeteFedRec Eq. 16.

  The mean over the tables of the cosine similarity matrix of the rows
  item_ids; the paper's 1/3 is 1/len(tables) here.

  Args:
    tables: float32 [I, N_a] item tables, a = 1..A, of any widths N_a.
    item_ids: int32 [K], the items V_kd.

  Returns:
    float32 [K, K].
  """
  if not tables:
    raise ValueError('tables must hold at least one table.')
  return tf.add_n([
      cosine_similarity_matrix(tf.gather(table, item_ids)) for table in tables
  ]) / float(len(tables))


def _distillation_loss(rows: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
  """L_kd of Eq. 17 for the rows [K, N] of V_kd and d_ens [K, K]."""
  return tf.reduce_sum(tf.square(cosine_similarity_matrix(rows) - target))


def ensemble_distillation(
    tables: Sequence[tf.Tensor],
    item_ids: tf.Tensor,
    *,
    learning_rate: float,
    steps: int = 1,
    step_rule: str = 'gradient',
) -> DistillationResult:
  """The server's distillation step, HeteFedRec Eq. 16-17 (Algorithm 1 l. 12).

  d_ens (Eq. 16) is computed once from the input tables and is a constant
  target. Each table then takes `steps` gradient-descent steps
  V <- V - learning_rate * dL_kd/dV on L_kd(V) (Eq. 17), which only changes
  the rows item_ids: every other row is returned bit-identical. The tables
  are distilled independently, so their order does not matter.

  item_ids are meant to be distinct; a repeated id counts as one row whose
  gradient is the sum over its copies, as the gradient of the table is.

  Example: a table and the same table scaled by 3 have equal cosine
  matrices, so both equal d_ens, L_kd = 0 and neither moves.

  Args:
    tables: float32 [I, N_a] item tables (e.g. V_s, V_m, V_l) of any widths
      N_a and the same number of items I.
    item_ids: int32 [K], V_kd, drawn at random by the caller.
    learning_rate: the gradient-descent step size.
    steps: the number of gradient-descent steps per table, a Python int
      >= 0 (the steps are unrolled under `tf.function`).
    step_rule: 'gradient' or 'adam' (see the module docstring).

  Returns:
    A `DistillationResult` of the distilled tables and the losses L_kd of
    each table before and after its steps.
  """
  if steps < 0:
    raise ValueError(f'steps must be non-negative; got {steps}.')
  if step_rule not in ('gradient', 'adam'):
    raise ValueError(
        f"step_rule must be 'gradient' or 'adam'; got {step_rule!r}."
    )
  tables = [tf.convert_to_tensor(table, tf.float32) for table in tables]
  item_ids = tf.convert_to_tensor(item_ids, tf.int32)
  target = tf.stop_gradient(ensemble_similarity(tables, item_ids))
  indices = tf.expand_dims(item_ids, -1)

  new_tables, loss_before, loss_after = [], [], []
  for table in tables:
    loss_before.append(_distillation_loss(tf.gather(table, item_ids), target))
    for _ in range(steps):
      rows = tf.gather(table, item_ids)
      with tf.GradientTape() as tape:
        tape.watch(rows)
        loss = _distillation_loss(rows, target)
      # A scatter (not `table - lr * dense gradient`) leaves the other rows
      # untouched, and adds the updates of a repeated id together.
      gradient = tape.gradient(loss, rows)
      if step_rule == 'adam':
        gradient = gradient / (tf.abs(gradient) + 1e-8)
      table = tf.tensor_scatter_nd_sub(
          table, indices, learning_rate * gradient
      )
    new_tables.append(table)
    loss_after.append(_distillation_loss(tf.gather(table, item_ids), target))
  return DistillationResult(
      tables=new_tables, loss_before=loss_before, loss_after=loss_after
  )


class WithEnsembleDistillation:
  """A finalizer (`templates.roles.Finalizer`): `inner`, then RESKD on the new `item_tables` (HeteFedRec Eq. 16-17).

  Each round distils the tables on |V_kd| = `num_items` items drawn by a
  shuffle seeded by (seed, round); measurements <loss_before [tiers],
  loss_after [tiers]> of Eq. 17's loss per table.
  """

  def __init__(self, inner, *, num_items: int, learning_rate: float,
               seed: int):
    self._inner = inner
    self._num_items = num_items
    self._learning_rate = learning_rate
    self._seed = seed
    self.initial_state = inner.initial_state

  def finalize(self, state, global_parameters, aggregate, round_num):
    state, new_global, inner_measurements = self._inner.finalize(
        state, global_parameters, aggregate, round_num
    )
    subset, learning_rate, seed = (
        self._num_items, self._learning_rate, self._seed)

    def distil(params, round_num):
      tables = list(params['item_tables'])
      num_items = tables[0].shape[0]
      item_ids = tf.random.experimental.stateless_shuffle(
          tf.range(num_items),
          seed=tf.stack([tf.constant(seed, tf.int64),
                         tf.cast(round_num, tf.int64)]),
      )[: min(subset, num_items)]
      result = ensemble_distillation(
          tables, item_ids, learning_rate=learning_rate, step_rule='adam',
      )
      distilled = collections.OrderedDict(params)
      distilled['item_tables'] = list(result.tables)
      return distilled, collections.OrderedDict(
          loss_before=tf.stack(result.loss_before),
          loss_after=tf.stack(result.loss_after),
      )

    new_global, measurements = finalizers.map_on_server(
        distil, new_global, round_num)
    return state, new_global, tff.federated_zip(collections.OrderedDict(
        optimizer=inner_measurements, distillation=measurements,
    ))
