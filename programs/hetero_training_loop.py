"""Program logic of the tiered methods (HeteFedRec and its baselines).

Protocol of HeteFedRec Sec. V.A-V.D: an 80/20 random split per user, binary
feedback with 4 negatives per positive redrawn every round from the items
outside the user's training data (or drawn once for the run), clients divided
into small / medium / large tiers by their number of training interactions
(5:3:2 by default), and full ranking over each user's non-training items for
Recall@20 / NDCG@20, overall and per tier (Fig. 6).

Rounds follow Sec. V.D: at the start of every epoch the client queue is
shuffled (seeded by (seed, epoch)), and each round takes the next
`clients_per_round` (256) clients of the queue, so an epoch is
ceil(users / 256) rounds. A round's randomness is seeded by (seed, round), so
a killed run resumes with the results an uninterrupted one would give.
"""

import asyncio
import collections
import dataclasses
import json
import os
import statistics
import time
import warnings
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from tff_fedrec import decorrelation
from tff_fedrec import hetero_models
from tff_fedrec import metrics
from tff_fedrec import tiers
from tff_fedrec.algorithms import hetefedrec
from tff_fedrec.algorithms import two_phase
from tff_fedrec.algorithms import user_groups
from tff_fedrec.programs import training_loop
from tff_fedrec.tasks import preprocessing

TOP_K = 20
TRAINING_NEGATIVES = ('per_round', 'once')


@dataclasses.dataclass(frozen=True)
class HeteroLoopConfig:
  """Round structure of a tiered run.

  Attributes:
    rounds: Total rounds.
    clients_per_round: Clients taken from the shuffled queue per round.
    tier_ratio: small:medium:large shares of users by training data size.
    negatives_per_positive: Training negatives per positive.
    training_negatives: 'per_round' draws a user's negatives (and the
      order of its examples) afresh every round it is selected; 'once'
      draws them once for the run, as the first author's public FedRec
      code samples its training negatives once.
    seed: Seeds the queue, the negatives and the initial user embeddings.
    eval_every: Evaluate every this many rounds (and after the last one).
    users_per_client: Users one TFF client simulates (`user_groups`).
    checkpoint_every: Save the program state every this many rounds (and
      after the last one); a killed run resumes from the last save.
  """

  rounds: int
  clients_per_round: int = 256
  tier_ratio: tuple[float, float, float] = (5, 3, 2)
  negatives_per_positive: int = 4
  training_negatives: str = 'per_round'
  seed: int = 0
  eval_every: int = 24
  users_per_client: int = 32
  checkpoint_every: int = 1

  def __post_init__(self):
    if self.training_negatives not in TRAINING_NEGATIVES:
      raise ValueError(
          f'training_negatives must be one of {TRAINING_NEGATIVES}; got '
          f'{self.training_negatives!r}.'
      )


def round_users(num_users: int, config: HeteroLoopConfig, round_num: int):
  """The round's users (sorted): the next slice of the epoch's queue."""
  per_epoch = -(-num_users // config.clients_per_round)
  epoch, position = divmod(round_num, per_epoch)
  queue = np.random.default_rng([config.seed, epoch, 1]).permutation(
      num_users
  )
  start = position * config.clients_per_round
  return np.sort(queue[start : start + config.clients_per_round])


def csr_rows(offsets, values, users):
  """The CSR rows of `users` as a new (offsets, values) pair."""
  counts = offsets[users + 1] - offsets[users]
  new_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
  index = np.concatenate(
      [np.arange(offsets[u], offsets[u + 1]) for u in users]
  ) if len(users) else np.zeros([0], np.int64)
  return new_offsets, values[index.astype(np.int64)]


def round_examples(data, config, round_num, users):
  """The users' training examples of the round (`training_examples` drawn
  for the round)."""
  return training_examples(
      data, config, users, np.random.default_rng([config.seed, round_num])
  )


def training_examples(data, config, users, rng):
  """The users' training examples: their training positives, each with
  `negatives_per_positive` items from outside the user's TRAINING data.
  Test items are not excluded: excluding them would tell every model which
  items they are (measured: Standalone, whose users never collaborate,
  reached NDCG@20 0.19 on ML-1M that way, as high as the federated
  models)."""
  train_offsets, train_items = csr_rows(
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
      negatives_per_positive=config.negatives_per_positive,
      rng=rng,
  )


def examples_of_users(
    examples: preprocessing.TrainingExamples, users: np.ndarray
) -> preprocessing.TrainingExamples:
  """The segments of `users` (in that order) of every user's examples."""
  offsets, index = csr_rows(
      examples.offsets, np.arange(examples.items.size), users
  )
  return preprocessing.TrainingExamples(
      offsets=offsets, items=examples.items[index],
      labels=examples.labels[index],
  )


def held_out_examples(num_examples, fraction: float, rng) -> list:
  """Per user of the round, 1 for the examples it holds out to guide its
  local training (HeteFedRec Sec. V.A: 10% of a selected client's training
  data): ceil(fraction * n) of its n examples drawn at random, but never
  all of them, and none when `fraction` is 0."""
  masks = []
  for n in num_examples:
    mask = np.zeros([n], np.float32)
    if fraction:
      count = min(int(np.ceil(fraction * n)), n - 1)
      mask[rng.choice(n, size=count, replace=False)] = 1.0
    masks.append(mask)
  return masks


def bytes_per_client(method: hetefedrec.HeteroMethod) -> dict:
  """Bytes one client of each data tier receives and sends per round
  (Table III): V_a plus the Theta_b it trains (b <= a with UDL), float32.
  Uploads are gradients of the same parameters. Clients that train models
  of their own (`standalone`) send and receive nothing."""
  params = method.initial_parameters
  result = {}
  if method.personal_models:
    return {
        name: {'download': 0.0, 'upload': 0.0} for name in tiers.TIER_NAMES
    }
  for data_tier, name in enumerate(tiers.TIER_NAMES):
    tier = method.model_tier[data_tier]
    terms = (range(tier + 1) if method.config.dual_task else (tier,))
    size = params['item_tables'][tier].nbytes + sum(
        leaf.nbytes
        for term in terms
        for leaf in tf.nest.flatten(params['score_layers'][term])
    )
    result[name] = {
        'download': float(size),
        'upload': float(size if method.included[data_tier] else 0),
    }
  return result


def tiered_ranking_metrics(
    data: preprocessing.RandomSplitData,
    data_tier: np.ndarray,
    score_users: Callable[..., np.ndarray],
    k: int = TOP_K,
) -> dict:
  """Recall@k / NDCG@k by full ranking over each user's non-training items,
  per data tier and overall (every evaluated user weighs the same).

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
  for tier, name in enumerate(tiers.TIER_NAMES):
    users = np.flatnonzero(data_tier == tier)
    if not users.size:
      continue
    train_offsets, train_items = csr_rows(
        data.train_offsets, data.train_items, users
    )
    scores = score_users(tier, users, train_offsets, train_items)
    exclude = np.zeros(scores.shape, bool)
    exclude[
        np.repeat(np.arange(users.size), np.diff(train_offsets)), train_items
    ] = True
    test_offsets, test_items = csr_rows(
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
    data: preprocessing.RandomSplitData, tier_ratio, k: int = TOP_K
) -> dict:
  """`tiered_ranking_metrics` of the training-popularity ranking."""
  popularity = np.bincount(
      data.train_items, minlength=data.num_items
  ).astype(np.float32)
  data_tier = tiers.assign_tiers_by_interactions(
      np.diff(data.train_offsets), tier_ratio
  )
  return tiered_ranking_metrics(
      data,
      data_tier,
      lambda tier, users, *_: np.broadcast_to(
          popularity, [users.size, data.num_items]
      ),
      k,
  )


class HeteroTrainingRun:
  """One run of a tiered method on random-split data."""

  def __init__(
      self,
      method: hetefedrec.HeteroMethod,
      data: preprocessing.RandomSplitData,
      config: HeteroLoopConfig,
      root_dir: str,
      *,
      log: Callable[[str], None] = print,
      worker_pid: Optional[int] = None,
      summary_fields: Optional[dict] = None,
  ):
    self._method = method
    self._data = data
    self._config = config
    self._root_dir = root_dir
    self._log = log
    self._worker_pid = worker_pid
    self._summary_fields = dict(summary_fields or {})
    os.makedirs(root_dir, exist_ok=True)
    self._state_manager = training_loop.checkpoint_manager(root_dir)
    self._csv = training_loop.metrics_csv(root_dir)
    self.data_tier = tiers.assign_tiers_by_interactions(
        np.diff(data.train_offsets), config.tier_ratio
    )
    self.local = self._initial_local()
    self._examples_drawn_once = None
    self.server_state = None
    self.history = []
    self.next_round = 0
    self.saved_round = 0

  def _initial_local(self) -> collections.OrderedDict:
    """Every user's client state: its private embedding and Adam state."""
    spec = self._method.spec
    users = hetero_models.initial_user_embeddings(
        spec, self._data.num_users, self._config.seed
    )
    # Each user's embedding is as wide as its model tier; zeros beyond.
    model_tier = np.asarray(self._method.model_tier)[self.data_tier]
    widths = np.asarray(spec.widths)[model_tier]
    users[np.arange(spec.widths[-1])[None, :] >= widths[:, None]] = 0.0
    return collections.OrderedDict(
        user=users,
        adam_m=np.zeros_like(users),
        adam_v=np.zeros_like(users),
        adam_step=np.zeros([self._data.num_users], np.float32),
    )

  def _group_local(self, users) -> collections.OrderedDict:
    """The client state of a group's users (all of one data tier)."""
    return collections.OrderedDict((k, v[users]) for k, v in self.local.items())

  def _store_group_local(self, users, local) -> None:
    for key in self.local:
      self.local[key][users] = np.asarray(local[key])

  def _program_state(self):
    return collections.OrderedDict(
        next_round=np.int64(self.next_round),
        server_state=self.server_state,
        local=self.local,
        history=json.dumps(self.history),
    )

  def restore_or_initialize(self) -> None:
    self.server_state = self._method.process.initialize()
    state, version = asyncio.run(
        self._state_manager.load_latest(self._program_state())
    )
    if state is None:
      return
    self.next_round = self.saved_round = int(state['next_round'])
    self.server_state = state['server_state']
    self.local = tf.nest.pack_sequence_as(
        self.local, [np.asarray(v) for v in tf.nest.flatten(state['local'])]
    )
    history = state['history']
    self.history = json.loads(
        history.decode() if isinstance(history, bytes) else str(history)
    )
    self._log(
        f'Resumed from checkpoint {version}: {self.next_round} of '
        f'{self._config.rounds} rounds done.'
    )

  def round_examples(self, round_num, users):
    """The round's training examples of `users`. Drawn once, every user's
    come from one draw seeded by the run's seed alone (made when first
    needed), so a resumed run trains on the same ones."""
    if self._config.training_negatives == 'per_round':
      return round_examples(self._data, self._config, round_num, users)
    if self._examples_drawn_once is None:
      self._examples_drawn_once = training_examples(
          self._data, self._config, np.arange(self._data.num_users),
          np.random.default_rng([self._config.seed, 4]),
      )
    return examples_of_users(self._examples_drawn_once, users)

  def _client_groups(self, users, examples, round_num):
    """(users of each TFF client, its client data), one tier per client.
    Each user has a seed of the round (its minibatch order)."""
    held_out = held_out_examples(
        np.diff(examples.offsets), self._method.config.validation_fraction,
        np.random.default_rng([self._config.seed, round_num, 2]),
    )
    seeds = np.random.default_rng([self._config.seed, round_num, 3]).integers(
        0, 2**31, size=(users.size, 2), dtype=np.int64
    )
    groups = []
    for data_tier in range(len(tiers.TIER_NAMES)):
      positions = np.flatnonzero(self.data_tier[users] == data_tier)
      if not positions.size:
        continue
      user_data = []
      for position in positions:
        items, labels = preprocessing.user_examples(examples, position)
        user_data.append(
            collections.OrderedDict(
                items=items.astype(np.int32),
                labels=labels.astype(np.float32),
                validation=held_out[position],
                seed=seeds[position],
            )
        )
      for group in user_groups.group_positions(
          [len(d['items']) for d in user_data], self._config.users_per_client
      ):
        data = user_groups.tier_group_client_data(
            [user_data[g] for g in group],
            tier=self._method.model_tier[data_tier],
            include=self._method.included[data_tier],
        )
        groups.append((users[positions[group]], data))
    return groups

  def run_round(self, round_num: int) -> dict:
    start = time.perf_counter()
    users = round_users(self._data.num_users, self._config, round_num)
    examples = self.round_examples(round_num, users)
    groups = self._client_groups(users, examples, round_num)
    locals_in = [self._group_local(group) for group, _ in groups]
    self.server_state, locals_out, round_metrics = two_phase.run_round(
        self._method.process, self.server_state, locals_in,
        [data for _, data in groups],
    )
    training_loop.raise_if_diverged(
        round_num, float(round_metrics['train_loss']),
        (self.server_state, locals_out), self.saved_round,
    )
    for (group, _), local in zip(groups, locals_out):
      self._store_group_local(group, local)
    record = {
        'round': round_num,
        'train_loss': float(round_metrics['train_loss']),
        'mean_kept_epoch': float(round_metrics['mean_kept_epoch']),
        'distillation_loss_before': float(
            np.sum(round_metrics['distillation_loss_before'])
        ),
        'distillation_loss_after': float(
            np.sum(round_metrics['distillation_loss_after'])
        ),
        'train_seconds': time.perf_counter() - start,
    }
    last = round_num == self._config.rounds - 1
    if last or (round_num + 1) % self._config.eval_every == 0:
      record['test'] = self.evaluate()
    record['seconds'] = time.perf_counter() - start
    return record

  def user_model(self, data_tier, users, train_offsets, train_items):
    """The models `users` (all of `data_tier`) score with: (user vectors
    [U, N] as the scorer sees them, item table [I, N] or [U, I, N], score
    layers with or without a leading [U]). The users' training items (CSR)
    are Fed-LightGCN's local graphs."""
    params = self.server_state['parameters']
    tier = self._method.model_tier[data_tier]
    width = self._method.spec.widths[tier]
    table = np.asarray(params['item_tables'][tier])
    user = self._user_representation(
        self.local['user'][users, :width], table, train_offsets, train_items
    )
    layers = tf.nest.map_structure(np.asarray, params['score_layers'][tier])
    return user, table, layers

  def _user_representation(self, user, tables, train_offsets, train_items):
    """`hetero_models.user_representation` of `user` [U, N] on its local
    graph; `tables` [I, N] shared or [U, I, N] one per user."""
    owner = np.repeat(np.arange(user.shape[0]), np.diff(train_offsets))
    rows = tables[train_items] if tables.ndim == 2 else tables[
        owner, train_items
    ]
    neighbor_sum = np.zeros(user.shape, np.float32)
    np.add.at(neighbor_sum, owner, rows)
    return hetero_models.user_representation(
        self._method.spec, tf.constant(user), tf.constant(neighbor_sum),
        tf.constant(np.diff(train_offsets)),
    ).numpy()

  def scores(self, data_tier, users, train_offsets, train_items):
    """Scores [len(users), I] of each user's own model (`user_model`)."""
    user, table, layers = self.user_model(
        data_tier, users, train_offsets, train_items
    )
    return hetero_models.score_all_items(
        tf.constant(user), tf.constant(table),
        tf.nest.map_structure(tf.constant, layers),
    ).numpy()

  def _large_table(self) -> Optional[np.ndarray]:
    """V_l, whose singular-value variance Table V reports."""
    return np.asarray(self.server_state['parameters']['item_tables'][-1])

  def evaluate(self) -> dict:
    """Recall@20 / NDCG@20 by full ranking, overall and per data tier."""
    return tiered_ranking_metrics(self._data, self.data_tier, self.scores)

  def train(self) -> dict:
    self.restore_or_initialize()
    for round_num in range(self.next_round, self._config.rounds):
      record = self.run_round(round_num)
      self.history.append(record)
      self._release(record)
      self.next_round = round_num + 1
      if (self.next_round % self._config.checkpoint_every == 0
          or self.next_round == self._config.rounds):
        asyncio.run(
            self._state_manager.save(self._program_state(), self.next_round)
        )
        self.saved_round = self.next_round
        training_loop.run_peak_rss_mb(self._root_dir, self._worker_pid)
      self._log(self._progress_line(record))
    return self.write_summary()

  def _release(self, record: dict) -> None:
    value = collections.OrderedDict(
        train_loss=np.float64(record['train_loss']),
        mean_kept_epoch=np.float64(record['mean_kept_epoch']),
        seconds=np.float64(record['seconds']),
    )
    if 'test' in record:
      for key in (f'recall@{TOP_K}', f'ndcg@{TOP_K}'):
        value[key.replace('@', '_at_')] = np.float64(record['test'][key])
    asyncio.run(self._csv.release(value, key=int(record['round'])))

  def _progress_line(self, record: dict) -> str:
    seconds = statistics.median(r['seconds'] for r in self.history)
    remaining = (self._config.rounds - self.next_round) * seconds
    line = (
        f'round {record["round"] + 1:5d}/{self._config.rounds}  '
        f'loss {record["train_loss"]:.4f}  {record["seconds"]:.2f}s  '
        f'ETA {remaining:.0f}s'
    )
    if 'test' in record:
      test = record['test']
      line += f'  test Recall@{TOP_K} {test[f"recall@{TOP_K}"]:.5f}'
      line += f'  NDCG@{TOP_K} {test[f"ndcg@{TOP_K}"]:.5f}'
    return line

  def summary(self) -> dict:
    evaluated = [r for r in self.history if 'test' in r]
    last = evaluated[-1]
    large_table = self._large_table()
    per_client = bytes_per_client(self._method)
    tier_sizes = tiers.tier_sizes(self.data_tier)
    per_round_share = self._config.clients_per_round / self._data.num_users
    # Local Adam: the epoch of 1..L a client kept, averaged over the rounds'
    # users (L without a validation split; 0 under server Adam). Rounds run
    # before this was recorded have none.
    kept_epochs = [r['mean_kept_epoch'] for r in self.history
                   if 'mean_kept_epoch' in r]
    return {
        **self._summary_fields,
        'rounds_completed': self.next_round,
        'selection': 'test metrics after the last round (no validation split)',
        'test': last['test'],
        'test_history': [
            {'round': r['round'] + 1, **r['test']} for r in evaluated
        ],
        'bytes_per_client': per_client,
        'bytes_per_round': {
            name: {
                direction: per_client[name][direction]
                * float(tier_sizes[index]) * per_round_share
                for direction in ('download', 'upload')
            }
            for index, name in enumerate(tiers.TIER_NAMES)
        },
        'tier_sizes': {
            name: int(tier_sizes[i]) for i, name in enumerate(tiers.TIER_NAMES)
        },
        'singular_value_variance_large': (
            None if large_table is None
            else decorrelation.singular_value_variance(large_table)
        ),
        'seconds_per_round': statistics.median(
            r['seconds'] for r in self.history
        ),
        'train_seconds_per_round': statistics.median(
            r['train_seconds'] for r in self.history
        ),
        'mean_kept_epoch': (
            statistics.fmean(kept_epochs) if kept_epochs else None
        ),
        'peak_rss_mb': training_loop.run_peak_rss_mb(
            self._root_dir, self._worker_pid
        ),
        'num_users': self._data.num_users,
        'num_items': self._data.num_items,
    }

  def write_summary(self) -> dict:
    summary = self.summary()
    training_loop.write_summary_json(self._root_dir, summary)
    return summary
