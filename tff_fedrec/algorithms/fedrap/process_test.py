"""Tests of FedRAP's upload: the group mean of the users' whole copies of
C, from their trained rows and their decay of the other rows."""

import numpy as np
import tensorflow as tf

from tff_fedrec import tier_codecs
from tff_fedrec.algorithms.fedrap import process


def test_group_mean_table_delta_is_the_mean_of_the_dense_copies():
  rng = np.random.default_rng(0)
  table = rng.normal(size=(6, 2)).astype(np.float32)
  row_ids = np.array([[1, 4, 0], [2, 4, 5]], np.int32)  # User 0: 2 rows.
  num_rows = np.array([2, 3], np.int32)
  scales = np.array([0.5, 0.9], np.float32)
  trained = rng.normal(size=(2, 3, 2)).astype(np.float32)
  trained[0, 2] = 1e3  # Padding: never part of the upload.
  copies = []
  for u in range(2):
    copy = table * scales[u]
    copy[row_ids[u, : num_rows[u]]] = trained[u, : num_rows[u]]
    copies.append(copy)
  expected = np.mean(copies, axis=0) - table
  delta = process.group_mean_table_delta(
      tf.constant(table), row_ids, num_rows, tf.gather(table, row_ids),
      tf.constant(trained), tf.constant(scales),
  )
  np.testing.assert_allclose(delta.numpy(), expected, rtol=1e-5, atol=1e-6)


def _dense_copies_delta(table, row_ids, num_rows, scales, trained, user):
  copy = table * scales[user]
  copy[row_ids[user, : num_rows[user]]] = trained[user, : num_rows[user]]
  return copy - table


def test_encoded_upload_is_each_users_whole_message_on_its_tiers_grid():
  rng = np.random.default_rng(1)
  table = rng.normal(size=(6, 2)).astype(np.float32)
  row_ids = np.array([[1, 4, 0], [2, 4, 5]], np.int32)
  num_rows = np.array([2, 3], np.int32)
  scales = np.array([0.5, 0.9], np.float32)
  trained = rng.normal(size=(2, 3, 2)).astype(np.float32)
  def arguments_of(users):
    return (tf.constant(table), row_ids[users], num_rows[users],
            tf.gather(table, row_ids[users]), tf.constant(trained[users]),
            tf.constant(scales[users]))
  seeds = tf.constant([[1, 2], [3, 4]], tf.int64)
  codecs = (tier_codecs.UpdateCodec('quant', 1), tier_codecs.UpdateCodec())
  # User 0 alone on 1 bit: its whole [6, 2] delta C_u - C (decayed rows
  # included) is sent as its min and max; ceil(12 / 8) + 8 bytes.
  alone, figures = process.encoded_group_mean_table_delta(
      codecs, *arguments_of([0]), tiers=tf.constant([0]), seeds=seeds[:1])
  expected = _dense_copies_delta(table, row_ids, num_rows, scales, trained, 0)
  values = np.unique(alone.numpy())
  np.testing.assert_allclose(values, [expected.min(), expected.max()],
                             rtol=1e-5)
  np.testing.assert_array_equal(figures['tier_upload_bytes'], [10.0, 0.0])
  np.testing.assert_array_equal(figures['tier_users'], [1.0, 0.0])
  # Untouched tiers: the plain group mean; user 1 sends 4 bytes an entry.
  mean, figures = process.encoded_group_mean_table_delta(
      (tier_codecs.UpdateCodec(),) * 2, *arguments_of([0, 1]),
      tiers=tf.constant([1, 1]), seeds=seeds)
  np.testing.assert_allclose(
      mean.numpy(),
      process.group_mean_table_delta(*arguments_of([0, 1])).numpy(),
      rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(figures['tier_upload_bytes'], [0.0, 96.0])
