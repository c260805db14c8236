import math
import re

import numpy as np
import pytest

from tff_fedrec import metrics


def _csr(test_lists):
  """CSR offsets and items of per-user test item lists."""
  offsets = np.cumsum([0] + [len(items) for items in test_lists])
  items = np.array([i for items in test_lists for i in items], np.int32)
  return offsets.astype(np.int64), items


def _slow_sampled(scores, ks):
  """The sampled-protocol metrics, one user at a time, as the NCF code does.

  Sorting with the negatives first and a stable sort reproduces pandas'
  rank(method='first'): ties go to the negatives.
  """
  hits = {k: [] for k in ks}
  ndcgs = {k: [] for k in ks}
  aucs = []
  for row in scores:
    labelled = [(s, 'neg') for s in row[1:]] + [(row[0], 'pos')]
    ordered = sorted(labelled, key=lambda pair: -pair[0])
    rank = [label for _, label in ordered].index('pos') + 1
    for k in ks:
      hits[k].append(1.0 if rank <= k else 0.0)
      ndcgs[k].append(math.log(2) / math.log(1 + rank) if rank <= k else 0.0)
    pairs = [
        1.0 if s < row[0] else 0.5 if s == row[0] else 0.0 for s in row[1:]
    ]
    aucs.append(sum(pairs) / len(pairs))
  summary = {}
  for k in ks:
    summary[f'hr@{k}'] = sum(hits[k]) / len(scores)
    summary[f'ndcg@{k}'] = sum(ndcgs[k]) / len(scores)
  summary['auc'] = sum(aucs) / len(scores)
  return summary


def _slow_full(scores, exclude_mask, test_lists, k):
  """Recall@K and NDCG@K one user at a time with a full sort.

  Sorting (-score, item) ranks ties by lower item index.
  """
  recalls, ndcgs = [], []
  for u, test in enumerate(test_lists):
    if not test:
      continue

    def sort_key(i, u=u):
      return (math.inf if exclude_mask[u, i] else -scores[u, i], i)

    ranked = sorted(range(scores.shape[1]), key=sort_key)
    top = ranked[:k]
    recalls.append(len(set(top) & set(test)) / len(test))
    dcg = sum(1 / math.log2(p + 2) for p, i in enumerate(top) if i in test)
    idcg = sum(1 / math.log2(p + 2) for p in range(min(len(test), k)))
    ndcgs.append(dcg / idcg)
  return {
      'recall': sum(recalls) / len(recalls),
      'ndcg': sum(ndcgs) / len(ndcgs),
  }


class TestSampledRank:

  def test_counts_negatives_scoring_higher(self):
    # Two negatives (0.9, 0.8) beat the positive 0.5: rank 3.
    scores = np.array([[0.5, 0.9, 0.1, 0.8, 0.2]])
    np.testing.assert_array_equal(metrics.sampled_rank(scores), [3])

  def test_ties_count_against_the_positive(self):
    # One negative above (0.9) and two tied (0.5): rank 1 + 1 + 2 = 4.
    scores = np.array([[0.5, 0.5, 0.9, 0.5, 0.1]])
    np.testing.assert_array_equal(metrics.sampled_rank(scores), [4])

  def test_constant_scorer_ranks_last(self):
    np.testing.assert_array_equal(
        metrics.sampled_rank(np.zeros((2, 100))), [100, 100]
    )

  @pytest.mark.parametrize('shape', [(3, 1), (0, 5), (5,), (2, 3, 4)])
  def test_rejects_scores_that_are_not_users_by_candidates(self, shape):
    # No negative column, no user, a flat vector, a third axis: each is
    # named with its shape, not left to fail (or average nothing) later.
    with pytest.raises(
        ValueError, match=r'^scores must be \[U, 1 \+ M\] .* got shape '
        + re.escape(str(shape)) + r'\.$'
    ):
      metrics.sampled_rank(np.zeros(shape))

  def test_rejects_nan(self):
    with pytest.raises(ValueError, match='^scores contain NaN.$'):
      metrics.sampled_rank(np.array([[np.nan, 0.1]]))


class TestHitRatioAndNdcg:

  def test_hand_built_ranks(self):
    ranks = np.array([1, 3, 11])
    # HR@10: ranks 1 and 3 are hits, 11 is not: 2/3.
    assert metrics.hit_ratio_at_k(ranks, 10) == pytest.approx(2 / 3)
    # NDCG@10: (1/log2(2) + 1/log2(4) + 0) / 3 = (1 + 0.5) / 3 = 0.5.
    assert metrics.ndcg_at_k(ranks, 10) == pytest.approx(0.5)
    # At K = 2 only rank 1 counts: HR = NDCG = 1/3.
    assert metrics.hit_ratio_at_k(ranks, 2) == pytest.approx(1 / 3)
    assert metrics.ndcg_at_k(ranks, 2) == pytest.approx(1 / 3)

  def test_rank_exactly_k_is_a_hit(self):
    # Rank 7 at K = 7: NDCG = 1/log2(8) = 1/3.
    assert metrics.hit_ratio_at_k(np.array([7]), 7) == 1.0
    assert metrics.ndcg_at_k(np.array([7]), 7) == pytest.approx(1 / 3)


class TestSampledAuc:

  def test_hand_built(self):
    # Positive 0.5 against 0.9 (loss), 0.5 (tie), 0.1 and 0.2 (wins):
    # (2 + 0.5) / 4 = 0.625.
    scores = np.array([[0.5, 0.9, 0.5, 0.1, 0.2]])
    assert metrics.sampled_auc(scores) == pytest.approx(0.625)

  def test_averages_over_users(self):
    # User 0 beats its one negative (1), user 1 loses (0): mean 0.5.
    assert metrics.sampled_auc(np.array([[1.0, 0.0], [0.0, 1.0]])) == 0.5


class TestSummarizeSampled:

  def test_perfect_scorer(self):
    scores = np.tile(np.linspace(1.0, 0.0, 100), (4, 1))
    summary = metrics.summarize_sampled(scores)
    assert summary == {
        'hr@5': 1.0,
        'ndcg@5': 1.0,
        'hr@10': 1.0,
        'ndcg@10': 1.0,
        'hr@20': 1.0,
        'ndcg@20': 1.0,
        'auc': 1.0,
    }
    assert all(type(value) is float for value in summary.values())

  def test_worst_scorer(self):
    # The positive is below all 99 negatives: rank 100, outside every K.
    scores = np.tile(np.linspace(0.0, 1.0, 100), (4, 1))
    summary = metrics.summarize_sampled(scores, ks=(10,))
    assert summary == {'hr@10': 0.0, 'ndcg@10': 0.0, 'auc': 0.0}

  def test_constant_scorer(self):
    # Every negative ties: rank 100 (no hit), AUC 0.5 (every pair half).
    summary = metrics.summarize_sampled(np.ones((3, 100)), ks=(10,))
    assert summary == {'hr@10': 0.0, 'ndcg@10': 0.0, 'auc': 0.5}

  def test_matches_a_per_user_loop(self):
    rng = np.random.default_rng(0)
    # Rounding to one decimal makes ties common.
    scores = np.round(rng.normal(size=(200, 100)), 1)
    expected = _slow_sampled(scores, ks=(1, 5, 10, 20))
    actual = metrics.summarize_sampled(scores, ks=(1, 5, 10, 20))
    assert actual.keys() == expected.keys()
    for key in expected:
      assert actual[key] == pytest.approx(expected[key]), key


class TestFullRankingMetrics:

  def test_hand_built_with_exclusions(self):
    scores = np.array([
        [0.9, 0.8, 0.7, 0.6, 0.5],
        [0.1, 0.2, 0.3, 0.4, 0.5],
    ])
    exclude = np.array([
        [True, False, False, False, False],
        [False, False, False, False, True],
    ])
    # User 0: item 0 is excluded, so the top 2 are items 1, 2. Test
    # {2, 4}: one hit at position 2. Recall 1/2; DCG = 1/log2(3);
    # IDCG = 1 + 1/log2(3).
    # User 1: item 4 is excluded, top 2 are items 3, 2. Test {3}: hit
    # at position 1. Recall 1, NDCG 1.
    offsets, items = _csr([[2, 4], [3]])
    result = metrics.full_ranking_metrics(
        scores,
        exclude_mask=exclude,
        test_offsets=offsets,
        test_items=items,
        k=2,
    )
    user0_ndcg = (1 / math.log2(3)) / (1 + 1 / math.log2(3))
    assert result['recall'] == pytest.approx((0.5 + 1.0) / 2)
    assert result['ndcg'] == pytest.approx((user0_ndcg + 1.0) / 2)

  def test_users_without_test_items_are_not_averaged(self):
    scores = np.array([[0.9, 0.1], [0.9, 0.1], [0.9, 0.1]])
    # Only user 1 has a test item (item 0, ranked 1st): both metrics 1,
    # not 1/3.
    offsets, items = _csr([[], [0], []])
    result = metrics.full_ranking_metrics(
        scores,
        exclude_mask=np.zeros((3, 2), bool),
        test_offsets=offsets,
        test_items=items,
        k=1,
    )
    assert result == {'recall': 1.0, 'ndcg': 1.0}

  def test_idcg_is_cut_at_k(self):
    # Four test items, K = 2, the top 2 are both test items: a perfect
    # NDCG of 1 (IDCG over min(4, 2) = 2 positions) and Recall 2/4.
    offsets, items = _csr([[0, 1, 2, 3]])
    result = metrics.full_ranking_metrics(
        np.array([[0.9, 0.8, 0.1, 0.2, 0.3]]),
        exclude_mask=np.zeros((1, 5), bool),
        test_offsets=offsets,
        test_items=items,
        k=2,
    )
    assert result == pytest.approx({'recall': 0.5, 'ndcg': 1.0})

  def test_ties_go_to_the_lower_item_index(self):
    # All scores tie, so the top 2 are items 0 and 1. Test {1, 3}: one
    # hit, at position 2: Recall 1/2, NDCG = (1/log2(3)) / (1 +
    # 1/log2(3)).
    offsets, items = _csr([[3, 1]])
    result = metrics.full_ranking_metrics(
        np.zeros((1, 4)),
        exclude_mask=np.zeros((1, 4), bool),
        test_offsets=offsets,
        test_items=items,
        k=2,
    )
    expected_ndcg = (1 / math.log2(3)) / (1 + 1 / math.log2(3))
    assert result == pytest.approx({'recall': 0.5, 'ndcg': expected_ndcg})

  @pytest.mark.parametrize('change,message', [
      ({'test_lists': [[1, 1], [0]]},
       'test_items repeat an item within a user.'),
      ({'test_lists': [[], []]}, 'No user has a test item.'),
      ({'exclude_shape': (2, 4)},
       'exclude_mask has shape (2, 4), scores (2, 3).'),
      ({'offsets': [0, 1]},
       'test_offsets must have U + 1 = 3 entries; got shape (2,).'),
      ({'k': 0}, 'k must be in [1, 3]; got 0.'),
      ({'k': 4}, 'k must be in [1, 3]; got 4.'),
      ({'nan': True}, 'scores contain NaN.'),
  ])
  def test_rejects_bad_arguments_naming_them(self, change, message):
    scores = np.zeros((2, 3))
    if change.get('nan'):
      scores[1, 2] = np.nan
    offsets, items = _csr(change.get('test_lists', [[1], [0]]))
    with pytest.raises(ValueError, match='^' + re.escape(message) + '$'):
      metrics.full_ranking_metrics(
          scores,
          exclude_mask=np.zeros(change.get('exclude_shape', (2, 3)), bool),
          test_offsets=np.array(change.get('offsets', offsets)),
          test_items=items,
          k=change.get('k', 2),
      )

  # K = 80 is the whole catalogue, the largest K allowed.
  @pytest.mark.parametrize(
      'k,user_batch_size', [(1, 7), (10, 1024), (50, 1), (80, 13)]
  )
  def test_matches_a_per_user_loop(self, k, user_batch_size):
    rng = np.random.default_rng(k)
    num_users, num_items = 60, 80
    # Scores on a coarse grid so that ties cross the K-th position.
    scores = rng.integers(0, 10, size=(num_users, num_items)) / 10.0
    exclude = rng.random((num_users, num_items)) < 0.3
    test_lists = []
    for u in range(num_users):
      allowed = np.flatnonzero(~exclude[u])
      size = rng.integers(0, 8)
      test_lists.append(sorted(rng.choice(allowed, size, replace=False)))
    offsets, items = _csr(test_lists)
    expected = _slow_full(scores, exclude, test_lists, k)
    result = metrics.full_ranking_metrics(
        scores,
        exclude_mask=exclude,
        test_offsets=offsets,
        test_items=items,
        k=k,
        user_batch_size=user_batch_size,
    )
    assert result == pytest.approx(expected)

  def test_random_scores_at_movielens_1m_size_give_chance_recall(self):
    # Many user batches at ML-1M size; how long this takes is measured by
    # programs/data_benchmark.py.
    rng = np.random.default_rng(0)
    num_users, num_items = 6040, 3706
    scores = rng.random((num_users, num_items), dtype=np.float32)
    exclude = rng.random((num_users, num_items)) < 0.05
    test_lists = [
        rng.choice(num_items, 5, replace=False) for _ in range(num_users)
    ]
    offsets, items = _csr(test_lists)
    result = metrics.full_ranking_metrics(
        scores,
        exclude_mask=exclude,
        test_offsets=offsets,
        test_items=items,
        k=20,
    )
    # Random scores: a test item is unexcluded with chance 0.95 and then
    # in the top 20 of about 0.95 * 3706 items with chance
    # 20 / (0.95 * 3706), so Recall@20 is near 20 / 3706 = 0.0054.
    assert result['recall'] == pytest.approx(20 / num_items, rel=0.25)


@pytest.mark.parametrize('seed', range(5))
def test_binary_auc_is_the_pairwise_win_rate_with_ties_half(seed):
  rng = np.random.default_rng(seed)
  labels = rng.random(200) < 0.3
  # Few distinct scores: many ties, across and within the classes.
  scores = rng.integers(0, 7, 200) + 0.5 * labels * rng.random(200).round()
  positives, negatives = scores[labels], scores[~labels]
  pairwise = np.mean(
      (positives[:, None] > negatives[None, :])
      + 0.5 * (positives[:, None] == negatives[None, :]))
  assert metrics.binary_auc(labels, scores) == pytest.approx(pairwise)


def test_binary_auc_of_hand_cases():
  assert metrics.binary_auc([1, 0, 1, 0], [0.9, 0.1, 0.8, 0.2]) == 1.0
  assert metrics.binary_auc([1, 0, 1, 0], [0.1, 0.9, 0.2, 0.8]) == 0.0
  assert metrics.binary_auc([1, 0, 1, 0], [0.5, 0.5, 0.5, 0.5]) == 0.5
  # One positive above one of two negatives, tied with the other: 0.75.
  assert metrics.binary_auc([1, 0, 0], [0.5, 0.2, 0.5]) == 0.75
  with pytest.raises(ValueError, match='positive and negative'):
    metrics.binary_auc([1, 1], [0.3, 0.4])


def test_log_loss_of_hand_cases():
  assert metrics.log_loss([1, 0], [0.8, 0.2]) == pytest.approx(-math.log(0.8))
  assert metrics.log_loss([1, 0, 1], [0.5, 0.5, 0.5]) == pytest.approx(
      math.log(2))
  # Clipped: a certain wrong answer costs -log(1e-7), not infinity.
  assert metrics.log_loss([1], [0.0]) == pytest.approx(-math.log(1e-7))
