"""HeteFedRec's protocol (Sec. V.A-V.D): an 80/20 random split per user,
Recall@20 / NDCG@20 by full ranking, overall and per tier.

Binary feedback with 4 negatives per positive from the items outside the
user's training data, redrawn every round (`training_negatives='per_round'`)
or drawn once for the run ('once', as the first author's public FedRec code
does). Rounds follow Sec. V.D: at the start of every epoch the client queue
is shuffled (seeded by (seed, epoch)), and each round takes the next
`clients_per_round` (256) clients of the queue, so an epoch is
ceil(users / 256) rounds; a round's randomness is seeded by (seed, round),
so a killed run resumes with the results an uninterrupted one would give.

Each evaluation ranks all of each user's non-training items with its own
model (`method.Method.score`) and reports Recall@20 / NDCG@20 overall and
per data tier (Fig. 6); the report is the last evaluation (the paper has no
validation split).

Example:
  >>> protocol = RandomSplit(datasets.load_random_split(config),
  ...                        user_tiers=tiers_of_users, seed=0)
  >>> protocol.round_input(0).users.size
  256
"""

import collections
import warnings
from typing import Callable, Sequence

import numpy as np

from tff_fedrec import csr
from tff_fedrec import metrics
from tff_fedrec import tiers
from tff_fedrec.algorithms import method as method_lib
from tff_fedrec.tasks import client_selection
from tff_fedrec.tasks import preprocessing
from tff_fedrec.tasks import protocol

TOP_K = 20
TRAINING_NEGATIVES = ('per_round', 'once')
DEFAULT_CLIENTS_PER_ROUND = 256  # Sec. V.D.
SELECTION = 'test metrics after the last round (no validation split)'


class RandomSplit(protocol.Protocol):
  """The protocol of the module docstring on a `RandomSplitData` split.

  Args:
    data: The split.
    user_tiers: int [U], each user's tier (the per-tier figures).
    tier_names: What tiers 0, 1, 2 are called in the figures.
    clients_per_round: None means min(256, U).
    negatives_per_positive: Training negatives per positive.
    training_negatives: 'per_round' or 'once'.
    seed: Seeds the queue, the negatives and the users' seeds.
  """

  name = 'random_split'
  fairness_metric = f'recall@{TOP_K}'

  def __init__(
      self,
      data: preprocessing.RandomSplitData,
      *,
      user_tiers: np.ndarray,
      tier_names: Sequence[str] = tiers.TIER_NAMES,
      clients_per_round=None,
      negatives_per_positive: int = 4,
      training_negatives: str = 'per_round',
      selection=client_selection.AllClients(),
      seed: int = 0,
  ):
    if training_negatives not in TRAINING_NEGATIVES:
      raise ValueError(
          f'training_negatives must be one of {TRAINING_NEGATIVES}; got '
          f'{training_negatives!r}.'
      )
    if clients_per_round is None:
      clients_per_round = min(DEFAULT_CLIENTS_PER_ROUND, data.num_users)
    if not 1 <= clients_per_round <= data.num_users:
      raise ValueError(
          f'clients_per_round must be in [1, {data.num_users}]; got '
          f'{clients_per_round}.'
      )
    self.data = data
    self.user_tiers = np.asarray(user_tiers)
    self.tier_names = tuple(tier_names)
    self.clients_per_round = clients_per_round
    self.negatives_per_positive = negatives_per_positive
    self.training_negatives = training_negatives
    self.seed = seed
    self.selection = selection
    self._pool = selection.queue(np.arange(data.num_users), self.user_tiers)
    if not self._pool.size:
      raise ValueError('No user is left to train: every user is excluded.')
    self.default_eval_every = client_selection.epoch_rounds(
        self._pool.size, selection.per_round(clients_per_round))
    self._examples_drawn_once = None

  def _examples(self, round_num, users):
    """The round's training examples of `users`. Drawn once, every user's
    come from one draw seeded by the run's seed alone (made when first
    needed), so a resumed run trains on the same ones."""
    if self.training_negatives == 'per_round':
      return training_examples(
          self.data, self.negatives_per_positive, users,
          np.random.default_rng([self.seed, round_num]),
      )
    if self._examples_drawn_once is None:
      self._examples_drawn_once = training_examples(
          self.data, self.negatives_per_positive,
          np.arange(self.data.num_users),
          np.random.default_rng([self.seed, 4]),
      )
    return examples_of_users(self._examples_drawn_once, users)

  def round_users(self, round_num: int) -> np.ndarray:
    return client_selection.epoch_round(
        self._pool, self.clients_per_round, self.selection, self.user_tiers,
        self.seed, round_num)

  @property
  def rounds_per_epoch(self) -> int:
    return self.default_eval_every

  def round_input(self, round_num: int) -> method_lib.RoundInput:
    users = self.round_users(round_num)
    examples = self._examples(round_num, users)
    seeds = np.random.default_rng([self.seed, round_num, 3]).integers(
        0, 2**31, size=(users.size, 2), dtype=np.int64
    )
    user_data = []
    for position in range(users.size):
      items, labels = preprocessing.user_examples(examples, position)
      user_data.append(collections.OrderedDict(
          items=items.astype(np.int32),
          labels=labels.astype(np.float32),
          seed=seeds[position],
      ))
    return method_lib.RoundInput(
        round_num=round_num, users=users, user_data=user_data,
        examples=examples, seed=self.seed,
    )

  def evaluate(self, method, server_state, store) -> dict:
    return {'test': tiered_ranking_metrics(
        self.data, self.user_tiers,
        lambda tier, users, *_: method.score(
            server_state, store, method_lib.CandidateItems(users)),
        tier_names=self.tier_names,
    )}

  def test_metrics(self, users, score_items) -> dict:
    """Recall@20 / NDCG@20 by full ranking for `users`, each scored by
    `score_items(position, items)` (e.g. an exported model's file)."""
    users = np.asarray(users)
    position = {user: index for index, user in enumerate(users.tolist())}
    only = np.full(self.data.num_users, -1)
    only[users] = 0  # One 'tier' holding the evaluated users.
    all_items = np.arange(self.data.num_items)
    result = tiered_ranking_metrics(
        self.data, only,
        lambda tier, tier_users, *_: np.stack([
            score_items(position[user], all_items)
            for user in tier_users.tolist()
        ]),
    )
    return {key: value for key, value in result.items() if key != 'per_tier'}

  def chance(self) -> dict:
    """{'recall@K': the mean over users with a test item of
    min(K / N_u, 1)}: Recall@K of a uniformly random ranking of a user's
    N_u non-training items (each test item is in the top K with
    probability K / N_u)."""
    has_test = np.diff(self.data.test_offsets) > 0
    unranked = self.data.num_items - np.diff(self.data.train_offsets)
    return {f'recall@{TOP_K}': float(np.mean(
        np.minimum(TOP_K / unranked[has_test], 1.0)))}

  def summary(self, history: list) -> dict:
    evaluated = [row for row in history if 'test' in row]
    return {
        'selection': SELECTION,
        'client_selection': self.selection.description,
        'test': evaluated[-1]['test'],
        'test_history': [
            {'round': row['round'] + 1, **row['test']} for row in evaluated
        ],
    }

  def progress(self, row: dict) -> str:
    if 'test' not in row:
      return ''
    test = row['test']
    return (f'test Recall@{TOP_K} {test[f"recall@{TOP_K}"]:.5f}  '
            f'NDCG@{TOP_K} {test[f"ndcg@{TOP_K}"]:.5f}')

  def results_rows(self, summary: dict) -> list[tuple[str, str]]:
    test = summary['test']
    rows = [(
        f'test Recall@{TOP_K} / NDCG@{TOP_K} (last round)',
        f'{test[f"recall@{TOP_K}"]:.5f} / {test[f"ndcg@{TOP_K}"]:.5f}',
    )]
    if test.get('tied_users'):
      rows.append((
          'users whose model scores every item the same',
          f'{test["tied_users"]} (collapsed; ranked by item index)',
      ))
    for name, tier in test['per_tier'].items():
      rows.append((
          f'  {name} ({tier["users"]} users)',
          f'{tier[f"recall@{TOP_K}"]:.5f} / {tier[f"ndcg@{TOP_K}"]:.5f}',
      ))
    return rows


def training_examples(data, negatives_per_positive: int, users, rng):
  """The users' training examples: their training positives, each with
  `negatives_per_positive` items from outside the user's TRAINING data.
  Test items are not excluded: excluding them would tell every model which
  items they are (measured: Standalone, whose users never collaborate,
  reached NDCG@20 0.19 on ML-1M that way, as high as the federated
  models)."""
  train_offsets, train_items = csr.rows_of(
      data.train_offsets, data.train_items, users
  )
  owner = np.repeat(np.arange(users.size), np.diff(train_offsets))
  ascending = train_items[np.lexsort((train_items, owner))]
  return preprocessing.sample_training_examples(
      train_offsets=train_offsets,
      train_items=train_items,
      interacted_offsets=train_offsets,
      interacted_items=ascending,
      num_items=data.num_items,
      negatives_per_positive=negatives_per_positive,
      rng=rng,
  )


def examples_of_users(
    examples: preprocessing.TrainingExamples, users: np.ndarray
) -> preprocessing.TrainingExamples:
  """The segments of `users` (in that order) of every user's examples."""
  offsets, index = csr.rows_of(
      examples.offsets, np.arange(examples.items.size), users
  )
  return preprocessing.TrainingExamples(
      offsets=offsets, items=examples.items[index],
      labels=examples.labels[index],
  )


def tiered_ranking_metrics(
    data: preprocessing.RandomSplitData,
    data_tier: np.ndarray,
    score_users: Callable[..., np.ndarray],
    k: int = TOP_K,
    tier_names: Sequence[str] = tiers.TIER_NAMES,
) -> dict:
  """Recall@k / NDCG@k by full ranking over each user's non-training items,
  per data tier (named by `tier_names`) and overall (every evaluated user
  weighs the same).

  `score_users(data_tier, users, train_offsets, train_items)` returns the
  scores [len(users), I] of the tier's users; train_offsets / train_items
  are their training items in CSR form.

  `tied_users` counts the evaluated users whose model gives every ranked
  item the same score (a collapsed scorer, e.g. all ReLUs dead): their
  top K is the item order of the tie-break (`metrics.full_ranking_metrics`),
  not a recommendation.
  """
  per_tier = {}
  totals = collections.Counter()
  for tier, name in enumerate(tier_names):
    users = np.flatnonzero(data_tier == tier)
    if not users.size:
      continue
    train_offsets, train_items = csr.rows_of(
        data.train_offsets, data.train_items, users
    )
    scores = score_users(tier, users, train_offsets, train_items)
    exclude = np.zeros(scores.shape, bool)
    exclude[
        np.repeat(np.arange(users.size), np.diff(train_offsets)), train_items
    ] = True
    test_offsets, test_items = csr.rows_of(
        data.test_offsets, data.test_items, users
    )
    result = metrics.full_ranking_metrics(
        scores, exclude_mask=exclude, test_offsets=test_offsets,
        test_items=test_items, k=k,
    )
    has_test = np.diff(test_offsets) > 0
    evaluated = int(np.count_nonzero(has_test))
    tied = int(np.count_nonzero(has_test & tied_rows(scores, exclude)))
    per_tier[name] = {
        f'recall@{k}': result['recall'],
        f'ndcg@{k}': result['ndcg'],
        'users': evaluated,
        'tied_users': tied,
    }
    totals['users'] += evaluated
    totals['tied_users'] += tied
    totals['recall'] += result['recall'] * evaluated
    totals['ndcg'] += result['ndcg'] * evaluated
  return {
      f'recall@{k}': totals['recall'] / totals['users'],
      f'ndcg@{k}': totals['ndcg'] / totals['users'],
      'tied_users': totals['tied_users'],
      'per_tier': per_tier,
  }


def tied_rows(
    scores: np.ndarray, exclude: np.ndarray, user_batch_size: int = 256
) -> np.ndarray:
  """bool [U]: whether all of a row's scores outside `exclude` are equal.

  Rows are read `user_batch_size` at a time, as `metrics.full_ranking_metrics`
  ranks them, so no masked copy of all scores is made.
  """
  tied = np.empty(scores.shape[0], bool)
  for start in range(0, scores.shape[0], user_batch_size):
    rows = slice(start, start + user_batch_size)
    ranked = np.where(exclude[rows], np.nan, scores[rows])
    with np.errstate(invalid='ignore'), warnings.catch_warnings():
      warnings.simplefilter('ignore', RuntimeWarning)  # all-excluded rows
      spread = np.nanmax(ranked, axis=1) - np.nanmin(ranked, axis=1)
    tied[rows] = ~(spread > 0)
  return tied


def popularity_metrics(
    data: preprocessing.RandomSplitData, user_tiers, k: int = TOP_K
) -> dict:
  """`tiered_ranking_metrics` of the training-popularity ranking."""
  popularity = np.bincount(
      data.train_items, minlength=data.num_items
  ).astype(np.float32)
  return tiered_ranking_metrics(
      data,
      user_tiers,
      lambda tier, users, *_: np.broadcast_to(
          popularity, [users.size, data.num_items]
      ),
      k,
  )
