import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec.algorithms.fedras import downlink_codecs
from tff_fedrec.algorithms.fedras import information_loss
from tff_fedrec.algorithms.fedras import row_codecs


def test_compression_loss_averages_over_rows_either_side_sends():
  reference = [[1.0, 0.0], [0.0, 0.0], [2.0, 2.0], [0.0, 0.0]]
  compressed = [[1.0, 1.0], [0.0, 3.0], [2.0, 0.0], [0.0, 0.0]]
  loss = information_loss.compression_loss(compressed, reference)
  # Rows 0, 1 and 2 count (6 entries); squared errors 1 + 9 + 4 = 14.
  assert loss.mse.numpy() == pytest.approx(14.0 / 6.0)
  # ||reference||^2 = 1 + 4 + 4 = 9.
  assert loss.relative.numpy() == pytest.approx(14.0 / 9.0)


def test_compression_loss_of_an_exact_copy_is_zero():
  table = np.random.default_rng(0).normal(size=[5, 3]).astype(np.float32)
  loss = information_loss.compression_loss(table, table)
  assert loss.mse.numpy() == 0.0 and loss.relative.numpy() == 0.0


def test_normalize_participation_and_clients():
  update_sum = [[2.0], [4.0], [0.0]]
  participants = [2.0, 1.0, 0.0]
  np.testing.assert_allclose(
      information_loss.normalize(update_sum, participants, 4, 'participation'),
      [[1.0], [4.0], [0.0]],
  )
  np.testing.assert_allclose(
      information_loss.normalize(update_sum, participants, 4, 'clients'),
      [[0.5], [1.0], [0.0]],
  )
  with pytest.raises(ValueError, match='normalization'):
    information_loss.normalize(update_sum, participants, 4, 'mean')


def _upload(num_rows, bandwidth):
  rows = np.random.default_rng(1).normal(size=[2, 4, 3]).astype(np.float32)
  return information_loss.decoded_uploads(
      row_codecs.ClusteredActions(), rows, np.array(num_rows, np.int32),
      bandwidth=np.array(bandwidth, np.int32),
      seeds=np.array([[0, 1], [0, 2]], np.int64),
      shared_seed=np.array([0, 0], np.int64),
  ), rows


def test_decoded_uploads_within_bandwidth_are_exact():
  decoded, rows = _upload([4, 2], [4, 4])
  np.testing.assert_allclose(decoded[0], rows[0], rtol=1e-6)
  np.testing.assert_allclose(decoded[1, :2], rows[1, :2], rtol=1e-6)


def test_decoded_uploads_over_bandwidth_share_actions():
  decoded, rows = _upload([4, 4], [1, 4])
  # One action: the user's four rows all decode to their mean.
  np.testing.assert_allclose(
      decoded[0], np.tile(rows[0].mean(axis=0), [4, 1]), rtol=1e-5
  )


def test_server_loss_of_top_k_downlink():
  payload = tf.constant([[3.0, 1.0], [0.0, -2.0], [0.0, 0.0]])
  full = downlink_codecs.TopKDownlink(3, 2, 2)
  loss, _ = information_loss.server_loss(full, payload, {}, [0, 0], 4)
  assert loss.mse.numpy() == 0.0
  one = downlink_codecs.TopKDownlink(3, 2, 1)
  loss, _ = information_loss.server_loss(one, payload, {}, [0, 0], 4)
  # Top-1 drops the 1.0 of row 0: squared error 1 over 4 entries; the
  # payload's squared norm is 9 + 1 + 4 = 14.
  assert loss.mse.numpy() == pytest.approx(0.25)
  assert loss.relative.numpy() == pytest.approx(1.0 / 14.0)
