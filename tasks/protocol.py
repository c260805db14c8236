"""An evaluation protocol: how a run's data is split, which users train each
round on which examples, and how a method's models are scored.

The one training loop (`programs/training_loop`) is driven by a protocol:

  data          the split (loaded by `load`);
  round_input   the round's users, their training examples (negatives
                drawn seeded by (seed, round), so a resumed run draws what
                an uninterrupted one would) and seeds: a
                `method.RoundInput`; `round_users` the users alone;
  evaluate      the method's models scored (`method.Method.score`) into
                the metrics of one evaluation, flat in the round's history
                row;
  summary       the reported result from the history, and which round it
                comes from;
  test_metrics  the test metrics of any scorer (an exported model's file);
  chance        the metric of a random ranking (the floors' `chance`);
  progress      the evaluation's part of a progress line;
  results_rows  the protocol's rows of the printed results table.

  LeaveOneOut   PFedRec Sec. 6.1 (`leave_one_out`): the latest item of
                each user is its test item, the second latest its
                validation item, each ranked among 99 sampled negatives;
                HR@10 / NDCG@10 at the round of best validation HR@10.
  RandomSplit   HeteFedRec Sec. V.A (`random_split`): 80/20 per user;
                Recall@20 / NDCG@20 by full ranking over each user's
                non-training items, overall and per tier, after the last
                round.

RF²'s click-through protocol is a third one of these.
"""

import abc
from typing import Optional

import numpy as np

from tff_fedrec.algorithms import method as method_lib


class Protocol(abc.ABC):
  """The interface of the module docstring.

  Attributes:
    name: 'leave_one_out' or 'random_split'.
    data: The split data; it has num_users, num_items, user_ids, item_ids,
      train_offsets and train_items.
    clients_per_round: Users per round.
    default_eval_every: Rounds between evaluations unless the run says.
    tier_names: What the run's tiers 0, 1, 2 are called.
    fairness_metric: The per-tier test figure (a key of the summary's
      test.per_tier entries) that MDAC compares (RF² Eq. 1): HR@10,
      Recall@20 or AUC.
  """

  name: str
  tier_names: tuple[str, ...]
  fairness_metric: str
  data: object
  clients_per_round: int
  default_eval_every: int = 1

  @property
  def rounds_per_epoch(self) -> int:
    """Rounds in which, on average, every client trains once."""
    return -(-self.data.num_users // self.clients_per_round)

  def run_data(self, user_tiers=None) -> method_lib.RunData:
    """What a method is told of the data (`method.RunData`)."""
    return method_lib.RunData.of(
        self.data, user_tiers,
        tier_names=self.tier_names)

  @abc.abstractmethod
  def round_input(self, round_num: int) -> method_lib.RoundInput:
    """Round `round_num`'s users and examples: a function of the seed and
    `round_num` alone, as the training loop draws round r + 1's on a
    thread while round r trains (`tff_fedrec.one_ahead`); the loop makes
    every call from that one thread."""

  def round_users(self, round_num: int) -> np.ndarray:
    """Round `round_num`'s users (sorted), as `round_input` draws them; a
    protocol whose draw is cheaper alone says how (the training loop asks
    for the rounds ahead: `programs.training_loop.last_rounds`)."""
    return np.asarray(self.round_input(round_num).users)

  @abc.abstractmethod
  def evaluate(self, method, server_state, store) -> dict:
    """One evaluation of every user's model: a flat dict of floats (and,
    for per-tier figures, nested dicts)."""

  @abc.abstractmethod
  def test_metrics(self, users, score_items) -> dict:
    """The test metrics of `users` scored by `score_items(position in
    users, item ids) -> scores` (an exported model, say)."""

  def chance(self) -> Optional[dict]:
    """{fairness_metric: its value under a uniformly random ranking}, or
    None for a protocol without sampled negatives to audit (`floors`)."""
    return None

  @abc.abstractmethod
  def summary(self, history: list) -> dict:
    """The reported result: the summary's protocol fields."""

  @abc.abstractmethod
  def progress(self, row: dict) -> str:
    """The evaluation's part of a progress line ('' if none)."""

  @abc.abstractmethod
  def results_rows(self, summary: dict) -> list[tuple[str, str]]:
    """(name, value) rows of the results table."""
