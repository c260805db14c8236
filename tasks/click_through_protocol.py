"""RF²'s protocol (Maeng et al., RecSys '22, Sec. 5.1; the authors' code as
`../shared/specs/rf2.md` sections 1 and 3 read it): click-through events
(`click_through`), per-user 90/10 in time, ROC-AUC and log-loss of every
test event, overall and per device tier.

Participation: one client per user with a training event. At the start of
every global epoch the clients are shuffled (seeded by (seed, epoch)) and
round r takes the next `clients_per_round` (100) of them, so every client
trains once per epoch. Client selection may be tier-aware
(`client_selection`: Exclude Lo leaves an epoch fewer rounds; Overselect's
epoch is ceil(n / int(K (1 + share))) rounds).

A round's user gets all its training events (full batch) and a seed. The
report is the last evaluation (the paper evaluates the final model).

Example:
  >>> protocol = ClickThrough(split, user_tiers=tiers, seed=0)
  >>> protocol.round_input(0).users.size
  100
"""

import collections
import dataclasses
from typing import Sequence

import numpy as np

from tff_fedrec import device_tiers
from tff_fedrec import metrics
from tff_fedrec.algorithms import method as method_lib
from tff_fedrec.tasks import click_through
from tff_fedrec.tasks import client_selection
from tff_fedrec.tasks import protocol

DEFAULT_CLIENTS_PER_ROUND = 100  # Sec. 5.1.
SELECTION = 'test metrics after the last round'


@dataclasses.dataclass(frozen=True)
class ClickThroughSplit:
  """The split the program and the methods read: the events, and each
  user's training events as CSR (`train_offsets`, `train_items` their
  movies), so the tier policies and `method.RunData` read it as any
  split."""

  events: click_through.ClickThroughData
  train_offsets: np.ndarray
  train_items: np.ndarray

  @classmethod
  def of(cls, events: click_through.ClickThroughData) -> 'ClickThroughSplit':
    counts = np.bincount(events.user[events.train],
                         minlength=events.num_users)
    return cls(events, np.r_[0, np.cumsum(counts)].astype(np.int64),
               events.item[events.train])

  @property
  def num_users(self) -> int:
    return self.events.num_users

  @property
  def num_items(self) -> int:
    return self.events.num_items

  @property
  def user_ids(self):
    return self.events.user_ids

  @property
  def item_ids(self):
    return self.events.item_ids

  def training_clicks(self) -> tuple:
    """(offsets, items) of each user's training clicks: what the Dirichlet
    mapping groups users by."""
    return click_through.clicks_per_user(self.events, self.events.train)


class ClickThrough(protocol.Protocol):
  """The protocol of the module docstring.

  Args:
    data: The split.
    user_tiers: int [U], each user's device tier.
    tier_names: What tiers 0, 1, 2 are called.
    clients_per_round: K (None: min(100, clients)).
    selection: A `client_selection` (AllClients, ExcludeTier, Overselect).
    seed: Seeds the queues and the users' seeds.
  """

  name = 'click_through'
  fairness_metric = 'auc'

  def __init__(self, data: ClickThroughSplit, *, user_tiers: np.ndarray,
               tier_names: Sequence[str] = device_tiers.TIER_NAMES,
               clients_per_round=None,
               selection=client_selection.AllClients(), seed: int = 0):
    self.data = data
    self.user_tiers = np.asarray(user_tiers)
    self.tier_names = tuple(tier_names)
    self.selection = selection
    self.seed = seed
    clients = np.flatnonzero(np.diff(data.train_offsets) > 0)
    self._queue = selection.queue(clients, self.user_tiers)
    if not self._queue.size:
      raise ValueError('No client is left to train: every user with '
                       'training events is excluded.')
    if clients_per_round is None:
      clients_per_round = min(DEFAULT_CLIENTS_PER_ROUND, self._queue.size)
    if not 1 <= clients_per_round <= self._queue.size:
      raise ValueError(f'clients_per_round must be in [1, '
                       f'{self._queue.size}] (the clients that train); got '
                       f'{clients_per_round}.')
    self.clients_per_round = clients_per_round
    self._rounds_per_epoch = client_selection.epoch_rounds(
        self._queue.size, selection.per_round(clients_per_round))
    self.default_eval_every = self._rounds_per_epoch
    events = data.events
    self._test_rows = np.flatnonzero(~events.train)

  @property
  def rounds_per_epoch(self) -> int:
    """Every client that trains does once in this many rounds."""
    return self._rounds_per_epoch

  def run_data(self, user_tiers=None) -> method_lib.RunData:
    events = self.data.events
    return method_lib.RunData.of(
        self.data, user_tiers, tier_names=self.tier_names, feature_shapes={
            'num_genres': len(events.genre_names),
            'genres_width': events.genres.shape[1],
            'history_length': events.history.shape[1],
        })

  def round_users(self, round_num: int) -> np.ndarray:
    return client_selection.epoch_round(
        self._queue, self.clients_per_round, self.selection,
        self.user_tiers, self.seed, round_num)

  def round_input(self, round_num: int) -> method_lib.RoundInput:
    users = self.round_users(round_num)
    events = self.data.events
    seeds = np.random.default_rng([self.seed, round_num, 3]).integers(
        0, 2**31, size=(users.size, 2), dtype=np.int64)
    user_data = []
    for position, user in enumerate(users.tolist()):
      start = events.offsets[user]
      rows = slice(start, start + int(self.data.train_offsets[user + 1]
                                      - self.data.train_offsets[user]))
      user_data.append(collections.OrderedDict(
          item=events.item[rows], genres=events.genres[rows],
          history=events.history[rows], label=events.label[rows],
          seed=seeds[position]))
    return method_lib.RoundInput(round_num=round_num, users=users,
                                 user_data=user_data, examples=None,
                                 seed=self.seed)

  def feature_rows(self, rows: np.ndarray) -> method_lib.FeatureRows:
    events = self.data.events
    return method_lib.FeatureRows(
        users=events.user[rows], features=collections.OrderedDict(
            item=events.item[rows], genres=events.genres[rows],
            history=events.history[rows]))

  def _metrics(self, rows, logits) -> dict:
    labels = self.data.events.label[rows]
    probabilities = 1.0 / (1.0 + np.exp(-np.asarray(logits, np.float64)))
    result = {'auc': metrics.binary_auc(labels, logits),
              'log_loss': metrics.log_loss(labels, probabilities),
              'events': int(rows.size)}
    return result

  def _tiered(self, rows, logits) -> dict:
    result = self._metrics(rows, logits)
    tiers = self.user_tiers[self.data.events.user[rows]]
    result['per_tier'] = {
        name: self._metrics(rows[tiers == tier], logits[tiers == tier])
        for tier, name in enumerate(self.tier_names) if np.any(tiers == tier)}
    return result

  def evaluate(self, method, server_state, store) -> dict:
    rows = self._test_rows
    logits = np.asarray(method.score(server_state, store,
                                     self.feature_rows(rows)))
    return {'test': self._tiered(rows, logits)}

  def test_rows(self, users) -> np.ndarray:
    """The rows of `users`' test events, user by user."""
    events = self.data.events
    rows = [np.arange(events.offsets[u], events.offsets[u + 1])
            for u in np.asarray(users).tolist()]
    rows = np.concatenate(rows) if rows else np.zeros([0], np.int64)
    return rows[~events.train[rows]]

  def test_metrics(self, users, score_items) -> dict:
    """AUC and log-loss of `users`' test events scored by
    `score_items(position in users, method.FeatureRows) -> logits`."""
    users = np.asarray(users)
    all_rows, all_logits = [], []
    for position, user in enumerate(users.tolist()):
      rows = self.test_rows([user])
      if not rows.size:
        continue  # A user with few events may have no test event.
      all_rows.append(rows)
      all_logits.append(np.asarray(score_items(position,
                                               self.feature_rows(rows))))
    if not all_rows:
      raise ValueError('None of these users has a test event.')
    return self._metrics(np.concatenate(all_rows),
                         np.concatenate(all_logits))

  def summary(self, history: list) -> dict:
    evaluated = [row for row in history if 'test' in row]
    return {
        'selection': SELECTION,
        'client_selection': self.selection.description,
        'rounds_per_epoch': self.rounds_per_epoch,
        'test': evaluated[-1]['test'],
        'test_history': [{'round': row['round'] + 1, **row['test']}
                         for row in evaluated],
    }

  def progress(self, row: dict) -> str:
    if 'test' not in row:
      return ''
    return (f'test AUC {row["test"]["auc"]:.4f}  log-loss '
            f'{row["test"]["log_loss"]:.4f}')

  def results_rows(self, summary: dict) -> list[tuple[str, str]]:
    test = summary['test']
    rows = [('test AUC / log-loss (last round)',
             f'{test["auc"]:.4f} / {test["log_loss"]:.4f}')]
    for name, tier in test['per_tier'].items():
      rows.append((f'  {name} ({tier["events"]} events)',
                   f'{tier["auc"]:.4f} / {tier["log_loss"]:.4f}'))
    return rows
