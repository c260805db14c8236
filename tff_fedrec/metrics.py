"""Ranking metrics for recommendation, in numpy and vectorized over users.

Two evaluation protocols are used by the papers this package reproduces:

* Sampled ranking (NCF, He et al. 2017, Sec. 4.1; PFedRec, Zhang et al. 2023):
  each user's held-out positive is ranked among M sampled negatives
  (M = 99), and HR@K, NDCG@K and AUC are read off that one rank.
  `scores` is float [U, 1 + M] with the positive in column 0.
* Full ranking (HeteFedRec, Yuan et al. 2024): every item is ranked, the
  user's training items are excluded, and Recall@K and NDCG@K are computed
  against all of the user's test items.

Click-through prediction (RF², Maeng et al. 2022) scores labelled events:
`binary_auc` over all of them (or one tier's), and `log_loss`.

For every metric here larger is better, and every value lies in [0, 1].
"""

from collections.abc import Sequence

import numpy as np


def _check_sampled(scores: np.ndarray) -> np.ndarray:
  scores = np.asarray(scores)
  if scores.ndim != 2 or scores.shape[0] == 0 or scores.shape[1] < 2:
    raise ValueError(
        'scores must be [U, 1 + M] with U >= 1 users and M >= 1 '
        f'negatives; got shape {scores.shape}.'
    )
  # NaN compares false with everything, so a NaN positive would rank 1st.
  if np.isnan(scores).any():
    raise ValueError('scores contain NaN.')
  return scores


def sampled_rank(scores: np.ndarray) -> np.ndarray:
  """The 1-based rank of each user's positive among its sampled negatives.

  rank_u = 1 + #{j >= 1 : s[u, j] >= s[u, 0]}

  Ties count against the positive: a negative scoring exactly the
  positive's score is ranked above it. The PFedRec and NCF reference code
  gets the same rank from pandas `rank(method='first')` with the negatives
  listed before the positive, and counting ties as losses keeps a
  constant scorer from earning a perfect HR.

  Args:
    scores: float [U, 1 + M]; column 0 is the held-out positive, columns
      1..M are sampled negatives.

  Returns:
    int64 [U], ranks in 1..1 + M (smaller is better).
  """
  scores = _check_sampled(scores)
  return 1 + np.count_nonzero(scores[:, 1:] >= scores[:, :1], axis=1)


def hit_ratio_at_k(ranks: np.ndarray, k: int) -> float:
  """HR@K = mean_u [rank_u <= K]; larger is better.

  Args:
    ranks: int [U], 1-based ranks of each user's single positive, as from
      `sampled_rank`.
    k: cut-off K >= 1.
  """
  return float(np.mean(np.asarray(ranks) <= k))


def ndcg_at_k(ranks: np.ndarray, k: int) -> float:
  """NDCG@K for one relevant item per user; larger is better.

  NDCG@K = mean_u [rank_u <= K] / log2(rank_u + 1)

  With a single relevant item the ideal DCG is 1/log2(2) = 1, so NDCG is
  the DCG of the positive alone, e.g. rank 3 gives 1/log2(4) = 0.5.

  Args:
    ranks: int [U], 1-based ranks of each user's single positive, as from
      `sampled_rank`.
    k: cut-off K >= 1.
  """
  ranks = np.asarray(ranks)
  gains = np.where(ranks <= k, 1.0 / np.log2(ranks + 1.0), 0.0)
  return float(np.mean(gains))


def sampled_auc(scores: np.ndarray) -> float:
  """AUC of the positive against its sampled negatives; larger is better.

  AUC = mean_u (#{j : s[u, j] < s[u, 0]} + 0.5 #{j : s[u, j] = s[u, 0]}) / M

  over negatives j = 1..M. Unlike `sampled_rank`, ties count half, the
  usual Mann-Whitney convention, so a constant scorer gets 0.5.

  Args:
    scores: float [U, 1 + M]; column 0 is the positive, as in
      `sampled_rank`.
  """
  scores = _check_sampled(scores)
  positive, negatives = scores[:, :1], scores[:, 1:]
  wins = np.count_nonzero(negatives < positive, axis=1)
  ties = np.count_nonzero(negatives == positive, axis=1)
  return float(np.mean((wins + 0.5 * ties) / negatives.shape[1]))


def binary_auc(labels: np.ndarray, scores: np.ndarray) -> float:
  """ROC AUC of `scores` for binary `labels` [N] (sklearn's
  `roc_auc_score`): the probability that a random positive outscores a
  random negative, ties counting half (Mann-Whitney U over average ranks).
  Needs both classes."""
  labels = np.asarray(labels).astype(bool).ravel()
  scores = np.asarray(scores, np.float64).ravel()
  if labels.shape != scores.shape:
    raise ValueError(
        f'labels {labels.shape} and scores {scores.shape} differ in shape.')
  positives = int(labels.sum())
  negatives = labels.size - positives
  if not positives or not negatives:
    raise ValueError(
        f'AUC needs positive and negative events; got {positives} and '
        f'{negatives}.')
  order = np.argsort(scores, kind='stable')
  sorted_scores = scores[order]
  # Average 1-based ranks of tied scores.
  starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
  ends = np.r_[starts[1:], scores.size]
  average = (starts + ends + 1) / 2.0
  ranks = np.empty(scores.size)
  ranks[order] = np.repeat(average, ends - starts)
  rank_sum = ranks[labels].sum()
  return float((rank_sum - positives * (positives + 1) / 2.0)
               / (positives * negatives))


def log_loss(labels: np.ndarray, probabilities: np.ndarray,
             eps: float = 1e-7) -> float:
  """Mean binary cross-entropy of `probabilities` (clipped to [eps,
  1 - eps], as sklearn's `log_loss`) for binary `labels`."""
  labels = np.asarray(labels, np.float64).ravel()
  p = np.clip(np.asarray(probabilities, np.float64).ravel(), eps, 1 - eps)
  if labels.shape != p.shape:
    raise ValueError(
        f'labels {labels.shape} and probabilities {p.shape} differ in shape.')
  return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log1p(-p)))


def summarize_sampled(
    scores: np.ndarray, ks: Sequence[int] = (5, 10, 20)
) -> dict[str, float]:
  """All sampled-protocol metrics of one evaluation, keyed for reporting.

  Args:
    scores: float [U, 1 + M]; column 0 is the positive, as in
      `sampled_rank`.
    ks: the cut-offs K.

  Returns:
    {'hr@K': ..., 'ndcg@K': ... for each K in `ks`, 'auc': ...}, floats.
  """
  ranks = sampled_rank(scores)
  summary = {}
  for k in ks:
    summary[f'hr@{k}'] = hit_ratio_at_k(ranks, k)
    summary[f'ndcg@{k}'] = ndcg_at_k(ranks, k)
  summary['auc'] = sampled_auc(scores)
  return summary


def _top_k_items(scores: np.ndarray, k: int) -> np.ndarray:
  """Item indices of the K best scores per row, best first.

  Equal scores are ordered by lower item index, so the result does not
  depend on how `np.argpartition` happens to order ties. Rows are
  partitioned rather than fully sorted, O(I + K log K) per user.

  Args:
    scores: float [B, I].
    k: 1 <= K <= I.

  Returns:
    int [B, K].
  """
  kth_best = -np.partition(-scores, k - 1, axis=1)[:, k - 1 : k]
  above = scores > kth_best
  at_kth = scores == kth_best
  # Of the items tied with the K-th best score, keep the lowest-indexed
  # ones, as many as the items strictly above leave room for.
  room = k - np.count_nonzero(above, axis=1, keepdims=True)
  chosen = above | (at_kth & (np.cumsum(at_kth, axis=1) <= room))
  # np.nonzero walks row-major, so each row's K items come out in index
  # order and the stable sort below keeps that order among equal scores.
  items = np.nonzero(chosen)[1].reshape(scores.shape[0], k)
  order = np.argsort(
      -np.take_along_axis(scores, items, axis=1), axis=1, kind='stable'
  )
  return np.take_along_axis(items, order, axis=1)


def full_ranking_metrics(
    scores: np.ndarray,
    *,
    exclude_mask: np.ndarray,
    test_offsets: np.ndarray,
    test_items: np.ndarray,
    k: int,
    user_batch_size: int = 256,
) -> dict[str, float]:
  """Recall@K and NDCG@K over all items (HeteFedRec protocol).

  Each user's excluded (training) items are scored -inf, the remaining
  items are ranked by score, and the top K are compared with the user's
  test items T_u with binary relevance:

    Recall@K_u = |top-K_u ∩ T_u| / |T_u|
    DCG@K_u    = sum_{p=1..K} [item at position p in T_u] / log2(p + 1)
    IDCG@K_u   = sum_{p=1..min(|T_u|, K)} 1 / log2(p + 1)
    NDCG@K_u   = DCG@K_u / IDCG@K_u

  Both are averaged over the users with at least one test item; larger is
  better. Equal scores are ranked by lower item index first, so results
  are deterministic. Excluded items rank last, so an excluded test item
  is a hit only when fewer than K items remain unexcluded.

  Users are scored `user_batch_size` at a time, which bounds the working
  memory to a few [user_batch_size, I] arrays.

  Args:
    scores: float [U, I], the model's score of every item for every user.
    exclude_mask: bool [U, I], True for items not to be ranked (training
      items).
    test_offsets: int [U + 1], CSR row offsets: user u's test items are
      test_items[test_offsets[u]:test_offsets[u + 1]].
    test_items: int [nnz], item indices in [0, I), unique within a user.
    k: cut-off, 1 <= K <= I.
    user_batch_size: users ranked per batch.

  Returns:
    {'recall': Recall@K, 'ndcg': NDCG@K}, floats.
  """
  # Not cast here: a float64 copy of all scores would defeat the batching.
  scores = np.asarray(scores)
  exclude_mask = np.asarray(exclude_mask, dtype=bool)
  test_offsets = np.asarray(test_offsets, dtype=np.int64)
  test_items = np.asarray(test_items, dtype=np.int64)
  num_users, num_items = scores.shape
  if exclude_mask.shape != scores.shape:
    raise ValueError(
        f'exclude_mask has shape {exclude_mask.shape}, scores {scores.shape}.'
    )
  if test_offsets.shape != (num_users + 1,):
    raise ValueError(
        f'test_offsets must have U + 1 = {num_users + 1} '
        f'entries; got shape {test_offsets.shape}.'
    )
  if not 1 <= k <= num_items:
    raise ValueError(f'k must be in [1, {num_items}]; got {k}.')
  # NaN is neither above nor tied with any score, so it breaks the top-K.
  if np.isnan(scores).any():
    raise ValueError('scores contain NaN.')

  num_test = np.diff(test_offsets)
  if not np.any(num_test > 0):
    raise ValueError('No user has a test item.')
  discounts = 1.0 / np.log2(np.arange(2, k + 2))
  ideal_dcg = np.cumsum(discounts)
  recall_sum = ndcg_sum = 0.0
  for start in range(0, num_users, user_batch_size):
    stop = min(start + user_batch_size, num_users)
    batch_test = num_test[start:stop]
    rows = np.repeat(np.arange(stop - start), batch_test)
    relevant = np.zeros((stop - start, num_items), dtype=bool)
    batch_items = test_items[test_offsets[start] : test_offsets[stop]]
    relevant[rows, batch_items] = True
    # A repeated test item would inflate |T_u| but not the hits.
    if np.any(np.count_nonzero(relevant, axis=1) != batch_test):
      raise ValueError('test_items repeat an item within a user.')

    top_k = _top_k_items(
        np.where(exclude_mask[start:stop], -np.inf, scores[start:stop]), k
    )
    hits = np.take_along_axis(relevant, top_k, axis=1)
    has_test = batch_test > 0
    recall_sum += np.sum(
        np.count_nonzero(hits, axis=1)[has_test] / batch_test[has_test]
    )
    dcg = hits @ discounts
    ndcg_sum += np.sum(
        dcg[has_test] / ideal_dcg[np.minimum(batch_test[has_test], k) - 1]
    )
  num_evaluated = np.count_nonzero(num_test > 0)
  return {
      'recall': float(recall_sum / num_evaluated),
      'ndcg': float(ndcg_sum / num_evaluated),
  }
