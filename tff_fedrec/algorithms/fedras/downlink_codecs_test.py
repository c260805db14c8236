"""Tests of the server's downlink messages and what clients decode."""

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrec.algorithms.fedras import action_clustering
from tff_fedrec.algorithms.fedras import cluster_and_split
from tff_fedrec.algorithms.fedras import compression
from tff_fedrec.algorithms.fedras import downlink_codecs

_NUM_ITEMS = 40
_DIM = 4
_SEED = tf.constant([1, 2], tf.int64)


def _update(seed=0):
  """An aggregated item update with two untrained (zero) items."""
  rows = np.random.default_rng(seed).normal(size=[_NUM_ITEMS, _DIM])
  rows[[3, 17]] = 0.0
  return rows.astype(np.float32)


def _fedras_codec(expected_groups=8, alpha=0.5):
  return downlink_codecs.ClusteredActionsDownlink(
      _NUM_ITEMS, _DIM, expected_groups=expected_groups, alpha=alpha
  )


def _groups_taken(e, alpha, group_count):
  """What a client of bandwidth e takes: the first stop's groups, at most
  round(e (1 + alpha)) (numpy, from the docstring)."""
  return min(max(int(e), int(np.floor(e * (1 + alpha) + 0.5))), group_count)


def test_each_bandwidth_decodes_the_matrix_actions_at_gives():
  codec = _fedras_codec()
  update = _update()
  history = cluster_and_split.initial_similarity_history()
  assert (codec.initial_groups, codec.max_groups) == (4, 12)

  message, _, summary = codec.encode(update, codec.initial_state(), _SEED)
  bandwidth = np.array([4, 5, 7, 8, 30], np.int32)
  rows, sent = (t.numpy() for t in codec.decode(message, bandwidth))

  split = cluster_and_split.cluster_and_split(
      update, expected_groups=8, alpha=0.5, history=history, seed=_SEED
  )
  # Round 0 has no threshold yet and splits to C_e = 8 groups.
  assert int(summary['group_count']) == int(split.group_count) == 8
  # e = 4 takes round(4 * 1.5) = 6 groups; e >= 5 the first stop's 8.
  taken = [_groups_taken(e, 0.5, 8) for e in bandwidth]
  assert taken == [6, 8, 8, 8, 8]
  for client, groups in enumerate(taken):
    expected = cluster_and_split.actions_at(update, split, groups)
    np.testing.assert_allclose(
        rows[client],
        action_clustering.decode_actions(
            expected.centroids, expected.assignments
        ),
        rtol=1e-5, atol=1e-6,
    )
    assert int(sent[client]) == compression.encoded_bytes(
        'fedras', _NUM_ITEMS, _DIM, groups
    )
  # By hand: e = 5 gets 8 actions of 4 floats and 40 one-byte indices.
  assert int(sent[1]) == 4 * 8 * 4 + 40
  np.testing.assert_array_equal(codec.message_bytes(message, bandwidth), sent)
  # Untrained items stay untouched; fewer groups mean a coarser matrix.
  np.testing.assert_array_equal(rows[:, [3, 17]], 0.0)
  assert len(np.unique(rows[0], axis=0)) == 6 + 1
  assert len(np.unique(rows[4], axis=0)) == 8 + 1


@pytest.mark.parametrize('alpha', [0.25, 0.5])
def test_a_round_that_stops_above_c_e_sends_its_groups_to_a_c_e_client(alpha):
  # Sec. 4.3: the first stop's matrix is what the server sends, anywhere in
  # [C_e (1 - alpha), C_e (1 + alpha)]. An unreachable threshold (every
  # group 0.999-similar) makes the round split on to C_m; a client whose
  # bandwidth is C_e = 8 receives, and pays for, all C_m groups.
  codec = _fedras_codec(alpha=alpha)
  state = {'total': tf.constant(0.999), 'count': tf.constant(1)}

  message, _, summary = codec.encode(_update(), state, _SEED)
  rows, sent = (t.numpy() for t in codec.decode(message, np.array([8])))

  c_m = int(8 * (1 + alpha) + 0.5)
  assert int(summary['group_count']) == c_m == codec.max_groups
  assert len(np.unique(rows[0], axis=0)) == c_m + 1  # And the zero rows.
  assert int(sent[0]) == 4 * c_m * _DIM + _NUM_ITEMS


def test_mean_cosine_is_the_rows_mean_cosine_to_their_group_means():
  codec = _fedras_codec()
  update = _update(3)
  message, _, summary = codec.encode(update, codec.initial_state(), _SEED)

  # numpy: the groups of the first stop from the message's labels (later
  # labels merged into their parents), each row's cosine to its group mean.
  labels = np.asarray(message['assignments']).copy()
  parents = np.asarray(message['parents'])
  count = int(message['group_count'])
  while np.any(labels >= count):
    labels = np.where(labels >= count, parents[np.maximum(labels, 0)],
                      labels)
  cosines = []
  for row, label in zip(update.astype(np.float64), labels):
    if label < 0:
      continue
    mean = update[labels == label].astype(np.float64).mean(axis=0)
    cosines.append(row @ mean / np.linalg.norm(row) / np.linalg.norm(mean))
  assert float(summary['mean_cosine']) == pytest.approx(np.mean(cosines),
                                                         rel=1e-5)
  assert 0.0 < float(summary['mean_cosine']) < 1.0


def test_the_similarity_history_carries_into_the_next_round():
  codec = _fedras_codec()
  _, first, summary = codec.encode(_update(0), codec.initial_state(), _SEED)
  assert int(first['count']) == 1
  np.testing.assert_allclose(
      first['total'], summary['similarity_at_expected'], rtol=1e-6
  )

  message, second, _ = codec.encode(_update(1), first, _SEED)

  split = cluster_and_split.cluster_and_split(
      _update(1), expected_groups=8, alpha=0.5,
      history=cluster_and_split.SimilarityHistory(
          first['total'], first['count']
      ),
      seed=_SEED,
  )
  assert int(second['count']) == 2
  np.testing.assert_allclose(second['total'], split.history.total, rtol=1e-6)
  assert int(message['group_count']) == int(split.group_count)
  np.testing.assert_array_equal(message['assignments'], split.assignments)


def test_fixed_k_when_alpha_is_zero():
  codec = _fedras_codec(expected_groups=6, alpha=0.0)
  message, _, _ = codec.encode(_update(), codec.initial_state(), _SEED)
  assert int(message['initial_count']) == int(message['group_count']) == 6
  rows, _ = codec.decode(message, np.array([6, 50], np.int32))
  np.testing.assert_array_equal(rows[0], rows[1])


def test_fewer_than_two_initial_groups_are_refused():
  with pytest.raises(ValueError, match='at least 2'):
    _fedras_codec(expected_groups=2, alpha=0.5)


def test_a_bandwidth_below_the_fewest_groups_fails():
  codec = _fedras_codec()
  message, _, _ = codec.encode(_update(), codec.initial_state(), _SEED)
  # e = 2 takes at most round(2 * 1.5) = 3 groups, below C_i = 4.
  with pytest.raises(tf.errors.InvalidArgumentError, match='C_e'):
    codec.decode(message, np.array([2], np.int32))


def test_zero_message_has_the_encoded_messages_shapes():
  for codec in (
      _fedras_codec(),
      downlink_codecs.TopKDownlink(_NUM_ITEMS, _DIM, 2),
      downlink_codecs.SvdDownlink(_NUM_ITEMS, _DIM, 2),
      downlink_codecs.ColrDownlink(_NUM_ITEMS, _DIM, 2),
  ):
    message, _, _ = codec.encode(_update(), codec.initial_state(), _SEED)
    tf.nest.map_structure(
        lambda zero, real: (
            np.testing.assert_equal(zero.shape, real.shape),
            np.testing.assert_equal(zero.dtype, real.dtype),
        ),
        codec.zero_message(), message,
    )


def test_baseline_downlinks_decode_their_encoders_output():
  update = _update()
  bandwidth = np.array([1, 9], np.int32)  # Irrelevant to the baselines.
  projection = compression.colr_projection(_SEED, 2, _DIM)
  cases = [
      (downlink_codecs.TopKDownlink(_NUM_ITEMS, _DIM, 2),
       compression.top_k_decode(
           compression.top_k_encode(update, 2), _DIM),
       'top_k'),
      (downlink_codecs.SvdDownlink(_NUM_ITEMS, _DIM, 2),
       compression.low_rank_decode(
           compression.svd_encode(update, 2)),
       'svd'),
      (downlink_codecs.ColrDownlink(_NUM_ITEMS, _DIM, 2),
       compression.colr_decode(
           compression.colr_encode(update, projection), projection),
       'colr'),
  ]
  for codec, expected, scheme in cases:
    message, state, summary = codec.encode(
        update, codec.initial_state(), _SEED
    )
    rows, sent = codec.decode(message, bandwidth)
    assert rows.shape == (2, _NUM_ITEMS, _DIM)
    for client in range(2):
      np.testing.assert_allclose(rows[client], expected, atol=1e-5)
    np.testing.assert_array_equal(
        sent, [compression.encoded_bytes(scheme, _NUM_ITEMS, _DIM, 2)]
        * 2,
    )
    np.testing.assert_array_equal(codec.message_bytes(message, bandwidth), sent)
    assert not state and not summary


def test_colr_downlink_is_exact_on_an_aggregate_of_its_round():
  # The mean of clients' A_u B_r is (mean A) B_r: the download loses
  # nothing. B_r: the first r rows of the round's factor, as uploads use.
  projection = compression.colr_projection(
      _SEED, _DIM, _DIM
  ).numpy()[:2]
  a = np.random.default_rng(3).normal(size=[_NUM_ITEMS, 2]).astype(np.float32)
  codec = downlink_codecs.ColrDownlink(_NUM_ITEMS, _DIM, 2)

  message, _, _ = codec.encode(a @ projection, codec.initial_state(), _SEED)
  rows, sent = codec.decode(message, np.array([1], np.int32))

  np.testing.assert_allclose(rows[0], a @ projection, atol=1e-5)
  assert int(sent[0]) == 4 * _NUM_ITEMS * 2


def test_colr_downlink_loses_the_components_of_higher_upload_ranks():
  # An upload of rank 3 has a component along B's third row, which a rank-2
  # downlink cannot carry.
  factor = compression.colr_projection(_SEED, _DIM, _DIM).numpy()
  a = np.random.default_rng(4).normal(size=[_NUM_ITEMS, 3]).astype(np.float32)
  codec = downlink_codecs.ColrDownlink(_NUM_ITEMS, _DIM, 2)

  message, _, _ = codec.encode(a @ factor[:3], codec.initial_state(), _SEED)
  rows, _ = codec.decode(message, np.array([1], np.int32))

  error = np.abs(rows[0] - a @ factor[:3]).max()
  assert error > 1e-2
  # What arrives is the least-squares fit on B_2's row space.
  fit = np.linalg.lstsq(factor[:2].T, (a @ factor[:3]).T, rcond=None)[0].T
  np.testing.assert_allclose(rows[0], fit @ factor[:2], atol=1e-4)

