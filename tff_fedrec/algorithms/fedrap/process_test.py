"""Tests of FedRAP's upload: the group mean of the users' whole copies of
C, from their trained rows and their decay of the other rows."""

import numpy as np
import tensorflow as tf

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
