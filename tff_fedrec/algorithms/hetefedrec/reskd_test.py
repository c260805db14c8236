"""Tests of the relation-based ensemble self-distillation (Eq. 16-17)."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec.aggregators import keyed
from tff_fedrec.algorithms.hetefedrec import reskd
from tff_fedrec.programs import execution
from tff_fedrec.templates import finalizers
from tff_fedrec.templates import toy_process

_NUM_ITEMS = 12
_WIDTHS = (2, 4, 8)
_ITEM_IDS = np.array([7, 0, 3, 10, 5], np.int32)


def _random_tables(seed, widths=_WIDTHS):
  rng = np.random.default_rng(seed)
  return [
      rng.normal(size=(_NUM_ITEMS, width)).astype(np.float32)
      for width in widths
  ]


def _numpy_cosine(vectors):
  vectors = vectors.astype(np.float64)
  norms = np.linalg.norm(vectors, axis=1, keepdims=True)
  return (vectors @ vectors.T) / (norms * norms.T)


def _numpy_ensemble(tables, item_ids):
  return np.mean([_numpy_cosine(t[item_ids]) for t in tables], axis=0)


def test_cosine_similarity_matrix_matches_numpy():
  vectors = _random_tables(0)[2][:6]

  got = reskd.cosine_similarity_matrix(tf.constant(vectors))

  assert got.shape == (6, 6)
  np.testing.assert_allclose(got, _numpy_cosine(vectors), atol=1e-6)
  np.testing.assert_allclose(np.diag(got), np.ones(6), atol=1e-6)


def test_cosine_similarity_matrix_is_safe_for_zero_vectors():
  vectors = tf.constant([[0.0, 0.0], [3.0, 4.0], [-3.0, -4.0]])

  with tf.GradientTape() as tape:
    tape.watch(vectors)
    got = reskd.cosine_similarity_matrix(vectors)
    total = tf.reduce_sum(got)
  gradient = tape.gradient(total, vectors).numpy()

  # The zero vector is 0-similar to all, itself included; the others are
  # opposite.
  np.testing.assert_allclose(
      got, [[0, 0, 0], [0, 1, -1], [0, -1, 1]], atol=1e-6
  )
  assert np.all(np.isfinite(gradient))


def test_ensemble_similarity_matches_numpy():
  tables = _random_tables(1)

  got = reskd.ensemble_similarity(
      [tf.constant(t) for t in tables], tf.constant(_ITEM_IDS)
  )

  assert got.shape == (len(_ITEM_IDS), len(_ITEM_IDS))
  np.testing.assert_allclose(
      got, _numpy_ensemble(tables, _ITEM_IDS), atol=1e-6
  )


def test_losses_before_are_eq_17_against_the_numpy_ensemble():
  tables = _random_tables(2)
  target = _numpy_ensemble(tables, _ITEM_IDS)

  result = reskd.ensemble_distillation(
      tables, _ITEM_IDS, learning_rate=0.01
  )

  for table, loss in zip(tables, result.loss_before):
    expected = np.sum((_numpy_cosine(table[_ITEM_IDS]) - target) ** 2)
    assert loss.dtype == tf.float32
    assert loss.shape == ()
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


def test_one_small_step_lowers_each_tables_loss():
  result = reskd.ensemble_distillation(
      _random_tables(3), _ITEM_IDS, learning_rate=0.01
  )

  assert len(result.tables) == len(_WIDTHS)
  for before, after in zip(result.loss_before, result.loss_after):
    assert before > 0
    assert after < before


def test_more_steps_lower_the_loss_further():
  tables = _random_tables(4)

  one = reskd.ensemble_distillation(
      tables, _ITEM_IDS, learning_rate=0.01, steps=1
  )
  five = reskd.ensemble_distillation(
      tables, _ITEM_IDS, learning_rate=0.01, steps=5
  )

  np.testing.assert_array_equal(five.loss_before, one.loss_before)
  for after_one, after_five in zip(one.loss_after, five.loss_after):
    assert after_five < after_one


def test_step_is_gradient_descent_on_the_selected_rows():
  # One step by hand: the gradient of Eq. 17 w.r.t. the selected rows with
  # d_ens held constant, subtracted with the learning rate.
  tables = _random_tables(5)
  target = reskd.ensemble_similarity(tables, _ITEM_IDS)
  rows = tf.constant(tables[1][_ITEM_IDS])
  with tf.GradientTape() as tape:
    tape.watch(rows)
    loss = tf.reduce_sum(
        tf.square(reskd.cosine_similarity_matrix(rows) - target)
    )
  expected_rows = rows - 0.05 * tape.gradient(loss, rows)

  result = reskd.ensemble_distillation(
      tables, _ITEM_IDS, learning_rate=0.05
  )

  np.testing.assert_allclose(
      tf.gather(result.tables[1], _ITEM_IDS), expected_rows, atol=1e-6
  )


def test_rows_outside_the_selected_items_are_unchanged_exactly():
  tables = _random_tables(6)
  others = np.setdiff1d(np.arange(_NUM_ITEMS), _ITEM_IDS)

  result = reskd.ensemble_distillation(
      tables, _ITEM_IDS, learning_rate=0.1, steps=3
  )

  for table, new_table in zip(tables, result.tables):
    new_table = new_table.numpy()
    assert new_table.shape == table.shape
    np.testing.assert_array_equal(new_table[others], table[others])
    assert np.any(new_table[_ITEM_IDS] != table[_ITEM_IDS])


def test_the_same_table_twice_has_zero_loss_and_does_not_move():
  # d_ens = (c + c) / 2 = c exactly in floating point, so the gradient is
  # exactly 0.
  table = _random_tables(7)[1]

  result = reskd.ensemble_distillation(
      [table, table], _ITEM_IDS, learning_rate=0.1
  )

  for new_table, before, after in zip(
      result.tables, result.loss_before, result.loss_after
  ):
    assert before == 0.0
    assert after == 0.0
    np.testing.assert_array_equal(new_table, table)


def test_a_scaled_copy_has_zero_loss_and_does_not_move():
  # cos(3u, 3v) = cos(u, v): the two cosine matrices agree up to float32
  # rounding of the normalisation, so L_kd ~ 0 and the steps are ~0.
  table = _random_tables(8)[2]

  result = reskd.ensemble_distillation(
      [table, 3.0 * table], _ITEM_IDS, learning_rate=0.1
  )

  for loss in (*result.loss_before, *result.loss_after):
    assert loss < 1e-10
  np.testing.assert_allclose(result.tables[0], table, atol=1e-6)
  np.testing.assert_allclose(result.tables[1], 3.0 * table, atol=1e-6)


def test_zero_steps_return_the_tables_unchanged():
  tables = _random_tables(9)

  result = reskd.ensemble_distillation(
      tables, _ITEM_IDS, learning_rate=0.1, steps=0
  )

  for table, new_table in zip(tables, result.tables):
    np.testing.assert_array_equal(new_table, table)
  np.testing.assert_array_equal(result.loss_after, result.loss_before)


def test_works_inside_tf_function():
  tables = _random_tables(10)

  @tf.function
  def distill(tables, item_ids):
    return reskd.ensemble_distillation(
        tables, item_ids, learning_rate=0.05, steps=2
    )

  eager = reskd.ensemble_distillation(
      tables, _ITEM_IDS, learning_rate=0.05, steps=2
  )
  for item_ids in (_ITEM_IDS, _ITEM_IDS[::-1].copy()):
    # Reversing V_kd permutes d_ens and the rows alike, so the result is the
    # same; the second call reuses the traced graph.
    got = distill([tf.constant(t) for t in tables], tf.constant(item_ids))
    assert isinstance(got, reskd.DistillationResult)
    for got_table, eager_table in zip(got.tables, eager.tables):
      np.testing.assert_allclose(got_table, eager_table, atol=1e-6)
    np.testing.assert_allclose(got.loss_before, eager.loss_before, rtol=1e-5)
    np.testing.assert_allclose(got.loss_after, eager.loss_after, rtol=1e-5)


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match='non-negative'):
    reskd.ensemble_distillation(
        _random_tables(11), _ITEM_IDS, learning_rate=0.1, steps=-1
    )
  with pytest.raises(ValueError, match='at least one table'):
    reskd.ensemble_distillation([], _ITEM_IDS, learning_rate=0.1)


def test_adam_step_rule_moves_each_coordinate_by_the_learning_rate():
  # A fresh Adam's first step is lr * g / (|g| + eps): every selected
  # coordinate with a non-zero gradient moves by lr, whatever the row norm.
  rng = np.random.default_rng(5)
  small = rng.normal(scale=0.01, size=(6, 3)).astype(np.float32)
  other = rng.normal(size=(6, 4)).astype(np.float32)
  ids = np.array([0, 2, 5], np.int32)
  result = reskd.ensemble_distillation(
      [small, other], ids, learning_rate=1e-4, step_rule='adam'
  )
  moved = np.abs(np.asarray(result.tables[0])[ids] - small[ids])
  np.testing.assert_allclose(moved, 1e-4, rtol=1e-3)
  assert float(result.loss_after[0]) < float(result.loss_before[0])
  with pytest.raises(ValueError, match='step_rule'):
    reskd.ensemble_distillation([small], ids, learning_rate=1.0,
                                       step_rule='sgd')


def test_ensemble_distillation_runs_after_the_inner_finalizer():
  rng = np.random.default_rng(0)
  tables = [rng.normal(size=(8, w)).astype(np.float32) for w in (2, 4)]
  params = collections.OrderedDict(item_tables=tables)
  zero_changes = lambda received, data: tf.nest.map_structure(
      tf.zeros_like, received['global_parameters'])
  options = dict(params=params, upload=zero_changes,
                 factory=keyed.KeyedFactory(collections.OrderedDict(
                     item_tables=tff.aggregators.SumFactory())))
  data = [collections.OrderedDict(
      upload=np.zeros([1, 2], np.float32), loss=np.zeros([1], np.float32))]
  locals_ = [np.zeros(1, np.float32)]
  with execution.worker_execution_context():
    plain = toy_process.build(finalizers.SubtractChanges(), **options)
    distilled = toy_process.build(
        reskd.WithEnsembleDistillation(
            finalizers.SubtractChanges(), num_items=3, learning_rate=0.01,
            seed=4),
        **options)
    # The uploads are zero: without distillation nothing moves.
    plain_state, _, _ = plain.next(plain.initialize(), locals_, data)
    state, _, metrics = distilled.next(distilled.initialize(), locals_, data)

  for got, table in zip(plain_state['global_parameters']['item_tables'],
                        tables):
    np.testing.assert_array_equal(got, table)
  # Distillation on the 3 items the (seed, round) shuffle picks, as
  # `reskd.ensemble_distillation` does it alone.
  items = tf.random.experimental.stateless_shuffle(
      tf.range(8), seed=tf.constant([4, 0], tf.int64))[:3]
  want = reskd.ensemble_distillation(
      [tf.constant(t) for t in tables], items, learning_rate=0.01,
      step_rule='adam')
  for got, expected in zip(state['global_parameters']['item_tables'],
                           want.tables):
    np.testing.assert_allclose(got, expected, rtol=1e-6)
  np.testing.assert_allclose(
      metrics['finalizer']['distillation']['loss_before'],
      np.stack(want.loss_before), rtol=1e-6)
