"""PFedRec's protocol (Sec. 6.1 and its reference code): leave-one-out by
timestamp, each held-out item ranked among 99 sampled negatives.

Per round r (0-based), seeded by (seed, r): `clients_per_round` users drawn
uniformly without replacement (all users by default, as the paper), and
every user's training examples: its training positives, each with
`negatives_per_positive` distinct items (as the reference code's
`random.sample`) from the user's negative pool, redrawn every round:

- 'never_interacted' (the papers' and their reference code's pool): items
  the user never interacted with. The held-out validation and test items
  are never training negatives, while the 99 + 99 items they are ranked
  against are drawn as negatives round after round: a model with enough
  per-user capacity can learn "what I was shown as a negative is bad" and
  rank the held-out item high without learning from other users.
- 'outside_training' (leak-free): items outside the user's training
  items, so the held-out items are drawn as training negatives as often as
  their evaluation negatives are.

The evaluation negatives are the split's (never interacted, distinct, the
validation's and the test's disjoint) under both. Each evaluation scores
every user's own model on its validation and test item with their
negatives (`method.CandidateItems`): HR@10, NDCG@10 and AUC, and the test
HR@10 / NDCG@10 of each tier of users (the run's tiers). The report picks
the round with the best validation HR@10 (the latest on ties, as the
reference code's `>=`) and reports test metrics at that round.

Example:
  >>> protocol = LeaveOneOut(datasets.load_leave_one_out(config),
  ...                        clients_per_round=100, seed=0)
  >>> protocol.round_input(0).users[:3]
"""

import collections
from typing import Optional, Sequence

import numpy as np

from tff_fedrec import csr
from tff_fedrec import metrics
from tff_fedrec import tiers
from tff_fedrec.algorithms import method as method_lib
from tff_fedrec.tasks import client_selection
from tff_fedrec.tasks import preprocessing
from tff_fedrec.tasks import protocol

SELECTION = 'test metrics at the round with the best validation HR@10'
# From this many users a round whose users are fewer than all draws only
# its users' examples (`LeaveOneOut`'s `round_users_only`).
ROUND_USERS_ONLY_FROM = 100_000
NEGATIVE_POOLS = ('never_interacted', 'outside_training')


class LeaveOneOut(protocol.Protocol):
  """The protocol of the module docstring on a `LeaveOneOutData` split."""

  name = 'leave_one_out'
  fairness_metric = 'hr@10'

  def __init__(
      self,
      data: preprocessing.LeaveOneOutData,
      *,
      clients_per_round: int,
      negatives_per_positive: int = 4,
      negative_pool: str = 'never_interacted',
      user_tiers: Optional[np.ndarray] = None,
      tier_names: Sequence[str] = tiers.TIER_NAMES,
      selection=client_selection.AllClients(),
      seed: int = 0,
      round_users_only: Optional[bool] = None,
  ):
    if not 1 <= clients_per_round <= data.num_users:
      raise ValueError(
          f'clients_per_round must be in [1, {data.num_users}]; got '
          f'{clients_per_round}.'
      )
    if negative_pool not in NEGATIVE_POOLS:
      raise ValueError(
          f'negative_pool must be one of {NEGATIVE_POOLS}; got '
          f'{negative_pool!r}.'
      )
    self.data = data
    self.clients_per_round = clients_per_round
    self.negatives_per_positive = negatives_per_positive
    self.negative_pool = negative_pool
    self.user_tiers = None if user_tiers is None else np.asarray(user_tiers)
    self.tier_names = tuple(tier_names)
    self.selection = selection
    # Drawing every user's examples each round (then keeping the round's
    # users') costs what the data holds: at a million users, seconds and
    # a gigabyte a round. Drawing only the round's users' follows its
    # clients; the draws of a user are made the same way, but the random
    # stream differs, so the default keeps the every-user draws (and every
    # figure measured with them) below ROUND_USERS_ONLY_FROM users.
    if round_users_only is None:
      round_users_only = (data.num_users >= ROUND_USERS_ONLY_FROM
                          and clients_per_round < data.num_users)
    self.round_users_only = round_users_only
    self.seed = seed
    self._pool = selection.queue(np.arange(data.num_users), self.user_tiers)
    if not self._pool.size:
      raise ValueError('No user is left to train: every user is excluded.')
    # Each user's items that are never its training negatives (CSR,
    # ascending per user).
    if negative_pool == 'never_interacted':
      self._excluded = (data.interacted_offsets, data.interacted_items)
    else:
      self._excluded = preprocessing.distinct_items_per_user(
          data.train_offsets, data.train_items, data.num_items
      )

  def round_input(self, round_num: int) -> method_lib.RoundInput:
    """The round's users (sorted), their data (items, labels, seed) and
    every user's training examples of the round."""
    data = self.data
    rng = np.random.default_rng([self.seed, round_num])
    users = self._draw_users(rng)
    if self.round_users_only:
      examples = self._round_users_examples(users, rng)
    else:
      examples = preprocessing.sample_training_examples(
          train_offsets=data.train_offsets,
          train_items=data.train_items,
          interacted_offsets=self._excluded[0],
          interacted_items=self._excluded[1],
          num_items=data.num_items,
          negatives_per_positive=self.negatives_per_positive,
          rng=rng,
          distinct_per_positive=True,
      )
    user_data = []
    for user in users:
      items, labels = preprocessing.user_examples(examples, user)
      user_data.append(collections.OrderedDict(
          items=items.astype(np.int32),
          labels=labels.astype(np.float32),
          seed=np.array([self.seed, round_num * data.num_users + user],
                        np.int64),
      ))
    return method_lib.RoundInput(
        round_num=round_num, users=users, user_data=user_data,
        examples=examples, seed=self.seed,
    )

  def _draw_users(self, rng: np.random.Generator) -> np.ndarray:
    """The round's users (sorted), `rng`'s first draw of the round
    (`client_selection.sampled_round`)."""
    return client_selection.sampled_round(
        self._pool, self.clients_per_round, self.selection, self.user_tiers,
        rng)

  def _round_users_examples(self, users: np.ndarray, rng
                            ) -> preprocessing.TrainingExamples:
    """The training examples of `users` (sorted) alone, drawn as
    `sample_training_examples` draws every user's, as a CSR over every
    user (the others' segments empty)."""
    data = self.data
    train = csr.rows_of(data.train_offsets, data.train_items, users)
    excluded = csr.rows_of(*self._excluded, users)
    drawn = preprocessing.sample_training_examples(
        train_offsets=train[0], train_items=train[1],
        interacted_offsets=excluded[0], interacted_items=excluded[1],
        num_items=data.num_items,
        negatives_per_positive=self.negatives_per_positive,
        rng=rng, distinct_per_positive=True,
    )
    counts = np.zeros([data.num_users], np.int64)
    counts[users] = np.diff(drawn.offsets)
    return preprocessing.TrainingExamples(
        offsets=np.concatenate([[0], np.cumsum(counts)]),
        items=drawn.items, labels=drawn.labels)

  def round_users(self, round_num: int) -> np.ndarray:
    return self._draw_users(np.random.default_rng([self.seed, round_num]))

  def run_data(self, user_tiers=None) -> method_lib.RunData:
    """The split's data, with the items each user is scored on: its
    validation and test items and their negatives."""
    return method_lib.RunData.of(self.data, user_tiers,
                                 scored_items=self.scored_items(),
                                 tier_names=self.tier_names)

  def scored_items(self) -> tuple[np.ndarray, np.ndarray]:
    """(offsets [U + 1], items): each user's validation and test
    candidates, distinct and ascending (`method.RunData.scored_items`)."""
    data = self.data
    candidates = np.concatenate([
        data.val_items[:, None], data.val_negatives,
        data.test_items[:, None], data.test_negatives,
    ], axis=1)
    offsets = np.arange(data.num_users + 1) * candidates.shape[1]
    # The split draws the negatives distinct from each other and from the
    # user's items, so a row sorted is its distinct items: a row sort, not
    # a sort of every user's pairs at once (5 GB at a million users).
    candidates.sort(axis=1)
    if not np.any(candidates[:, 1:] == candidates[:, :-1]):
      return offsets, candidates.reshape(-1)
    return preprocessing.distinct_items_per_user(
        offsets, candidates.reshape(-1), data.num_items)

  def _scores(self, method, server_state, store, split: str):
    positives = getattr(self.data, f'{split}_items')
    negatives = getattr(self.data, f'{split}_negatives')
    candidates = np.concatenate([positives[:, None], negatives], axis=1)
    return method.score(server_state, store, method_lib.CandidateItems(
        np.arange(self.data.num_users), candidates))

  def evaluate(self, method, server_state, store) -> dict:
    val = metrics.summarize_sampled(
        self._scores(method, server_state, store, 'val'))
    test_scores = self._scores(method, server_state, store, 'test')
    test = metrics.summarize_sampled(test_scores)
    return {
        'val_hr@10': val['hr@10'], 'val_ndcg@10': val['ndcg@10'],
        'test_hr@10': test['hr@10'], 'test_ndcg@10': test['ndcg@10'],
        'test_auc': test['auc'],
        'test_per_tier': self._per_tier(test_scores),
    }

  def _per_tier(self, scores) -> dict:
    """{tier name: {'hr@10', 'ndcg@10', 'users'}} of the tiers that have
    users ({} without the run's tiers)."""
    per_tier = {}
    if self.user_tiers is None:
      return per_tier
    for tier, name in enumerate(self.tier_names):
      users = np.flatnonzero(self.user_tiers == tier)
      if users.size:
        result = metrics.summarize_sampled(scores[users], ks=(10,))
        per_tier[name] = {'hr@10': result['hr@10'],
                          'ndcg@10': result['ndcg@10'],
                          'users': int(users.size)}
    return per_tier

  def test_metrics(self, users, score_items) -> dict:
    """HR@10 / NDCG@10 of the test split for `users`, each scored by
    `score_items(position, items)` (e.g. an exported model's file)."""
    candidates = np.concatenate(
        [self.data.test_items[users, None], self.data.test_negatives[users]],
        axis=1,
    )
    scores = np.stack([
        score_items(position, items)
        for position, items in enumerate(candidates)
    ])
    result = metrics.summarize_sampled(scores)
    return {'hr@10': result['hr@10'], 'ndcg@10': result['ndcg@10']}

  def chance(self) -> dict:
    """{'hr@10': K / (1 + M)}: HR@10 of a uniformly random ranking of the
    positive among its M test negatives."""
    return {'hr@10': min(10 / (1 + self.data.test_negatives.shape[1]), 1.0)}

  def summary(self, history: list) -> dict:
    evaluated = [row for row in history if 'val_hr@10' in row]
    best = best_row(evaluated)
    return {
        'best_round': int(best['round']) + 1,
        'selection': SELECTION,
        'negative_pool': self.negative_pool,
        'client_selection': self.selection.description,
        'validation': {
            'hr@10': best['val_hr@10'], 'ndcg@10': best['val_ndcg@10'],
        },
        'test': {
            'hr@10': best['test_hr@10'], 'ndcg@10': best['test_ndcg@10'],
            'auc': best['test_auc'], 'per_tier': best['test_per_tier'],
        },
        'final_round_test': {
            'hr@10': evaluated[-1]['test_hr@10'],
            'ndcg@10': evaluated[-1]['test_ndcg@10'],
        },
    }

  def progress(self, row: dict) -> str:
    if 'val_hr@10' not in row:
      return ''
    return (f'val HR@10 {row["val_hr@10"]:.4f}  '
            f'NDCG@10 {row["val_ndcg@10"]:.4f}')

  def results_rows(self, summary: dict) -> list[tuple[str, str]]:
    test, val = summary['test'], summary['validation']
    return [
        ('best round (by validation HR@10)', str(summary['best_round'])),
        ('validation HR@10 / NDCG@10',
         f'{val["hr@10"]:.4f} / {val["ndcg@10"]:.4f}'),
        ('test HR@10 / NDCG@10 at best round',
         f'{test["hr@10"]:.4f} / {test["ndcg@10"]:.4f}'),
        ('test AUC at best round', f'{test["auc"]:.4f}'),
        *[(f'  {name} ({tier["users"]} users)',
           f'{tier["hr@10"]:.4f} / {tier["ndcg@10"]:.4f}')
          for name, tier in test['per_tier'].items()],
    ]


def best_row(evaluated: list) -> dict:
  """The evaluated row of the best validation HR@10 (latest on ties)."""
  best = evaluated[0]
  for row in evaluated:
    if row['val_hr@10'] >= best['val_hr@10']:
      best = row
  return best
