"""The method interface: what the training loop, the protocols and export
ask of a built method.

A registry builder (`registry`) returns a `Method`: its TFF process and the
program-side driver of one round, bound to the users it trains
(`RunData`). The training loop (`programs/training_loop`) runs

  store = method.initial_store()
  state = method.process.initialize()
  result = method.run_round(state, store, RoundInput(...))   # each round
  scores = method.score(result.server_state, store, examples)

and the protocol (`tasks/`) chooses the evaluation examples and turns the
scores into its metrics: a ranking protocol's examples are each user's
candidate items (`CandidateItems`), a click-through protocol's feature
rows. A method reports every round's figures as `RoundResult.metrics`
(train loss, bytes sent each way, method diagnostics: floats, one history
row each), adds its own fields to the run's summary (`summary_fields`) and
its rows to the printed results (`results_rows`).

Example (the loop's view of any method):
  >>> method = registry.get('pfedrec').build(data=run_data, seed=0, ...)
  >>> store, state = method.initial_store(), method.process.initialize()
  >>> result = method.run_round(state, store, round_input)
  >>> method.score(result.server_state, store,
  ...              CandidateItems(np.arange(3), candidates))
"""

import abc
import collections
import dataclasses
import statistics
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow_federated as tff

from tff_fedrec import client_state_store


@dataclasses.dataclass(frozen=True)
class RunData:
  """What a method knows of the users it trains.

  Attributes:
    num_users: U.
    num_items: I.
    train_offsets: int64 [U + 1], CSR offsets of each user's training items.
    train_items: int [nnz], their item indices.
    user_tiers: int32 [U], each user's tier (0 small, 1 medium, 2 large:
      `tiers`): the run's assignment, given to every method (HeteFedRec
      sizes models by it, FedRAS can set bandwidths by it, the protocols
      report per tier); None puts every user in one tier, and a method
      that needs tiers refuses it.
    tier_names: What the protocol calls tiers 0, 1, 2 (None: the tier
      policy's default, `tiers.TIER_NAMES`).
    feature_shapes: The widths of a click-through protocol's feature rows
      (`{'num_genres': G, 'genres_width': ..., 'history_length': H}`), or
      None for a ranking protocol.
    scored_items: (offsets int64 [U + 1], items int [nnz]): CSR of the
      items the protocol scores each user's model on, ascending per user
      (leave-one-out: its validation and test candidates), or None when it
      may score any item (a full ranking). A method that keeps per-user
      rows only to be scored by may keep just these between a user's
      rounds (`RoundInput.last_round_users`).
  """

  num_users: int
  num_items: int
  train_offsets: np.ndarray
  train_items: np.ndarray
  user_tiers: Optional[np.ndarray] = None
  scored_items: Optional[tuple[np.ndarray, np.ndarray]] = None
  feature_shapes: Optional[dict] = None
  tier_names: Optional[tuple[str, ...]] = None

  @classmethod
  def of(cls, data, user_tiers=None, scored_items=None, **fields
         ) -> 'RunData':
    """From a protocol's split data (anything with these fields)."""
    return cls(data.num_users, data.num_items, data.train_offsets,
               data.train_items, user_tiers, scored_items, **fields)

  @property
  def train_counts(self) -> np.ndarray:
    return np.diff(self.train_offsets)


@dataclasses.dataclass(frozen=True)
class RoundInput:
  """One round's users and data, as the protocol drew them.

  Attributes:
    round_num: r, 0-based.
    users: int [n], the round's users, sorted.
    user_data: Per user, `OrderedDict(items int32 [n_u], labels float32
      [n_u], seed int64 [2])`, its training examples of the round.
    examples: The protocol's training examples of the round (CSR over
      users, `tasks.preprocessing.TrainingExamples`); FedRecon reads every
      user's.
    seed: The run's seed.
    last_round_users: bool [n]: which of the round's users train in no
      later round of the run (the training loop's `last_rounds`). Their
      client state is kept whole, as export reads it; the others' may keep
      only what the protocol scores (`RunData.scored_items`). None: every
      user's state is kept whole.
  """

  round_num: int
  users: np.ndarray
  user_data: Sequence[collections.OrderedDict]
  examples: Any
  seed: int
  last_round_users: Optional[np.ndarray] = None


@dataclasses.dataclass(frozen=True)
class CandidateItems:
  """A ranking protocol's evaluation examples: items each user's own model
  scores.

  Attributes:
    users: int [U], the users.
    items: int [U, C], each user's candidates, or None for every item (a
      full ranking, scores [U, I]).
  """

  users: np.ndarray
  items: Optional[np.ndarray] = None


@dataclasses.dataclass(frozen=True)
class FeatureRows:
  """A click-through protocol's evaluation examples: events, each scored
  by its user's model.

  Attributes:
    users: int [N], each event's user.
    features: `OrderedDict(item [N], genres [N, G], history [N, H])`.
  """

  users: np.ndarray
  features: collections.OrderedDict


@dataclasses.dataclass(frozen=True)
class RoundResult:
  """`run_round`'s result: the new server state and the round's figures
  (`train_loss` always; `upload_bytes` / `download_bytes` when the method
  counts them)."""

  server_state: Any
  metrics: dict


@dataclasses.dataclass(frozen=True)
class OnDeviceModel:
  """The parameters of a model a phone runs, and whom it is evaluated on.

  Attributes:
    tier: 'single' (one-size methods) or 'small' / 'medium' / 'large'.
    user: The user it belongs to, or None for a tier's global model (whose
      user part stays on the phone: it takes the user vector as input,
      unless the method has none).
    architecture: One of `models.ARCHITECTURES`.
    params: `OrderedDict(item_embedding [I, d], score_layers [{kernel,
      bias}], user_embedding [d] (a user's model only))`.
    eval_users: The user indices its evaluation covers.
    eval_user_vectors: float32 [len(eval_users), d], their user vectors
      when the model takes one, else None.
    split_first_layer: 'neural_cf' computed as HeteFedRec's tiers are
      (`models.RecommenderSpec.split_first_layer`).
  """

  tier: str
  user: Optional[int]
  architecture: str
  params: collections.OrderedDict
  eval_users: np.ndarray
  eval_user_vectors: Optional[np.ndarray] = None
  split_first_layer: bool = False


class Method(abc.ABC):
  """A built method (module docstring).

  Attributes:
    process: Its `tff.templates.IterativeProcess`.
  """

  process: tff.templates.IterativeProcess

  @abc.abstractmethod
  def initial_store(self) -> client_state_store.ClientStateStore:
    """Every user's client state before the first round."""

  @abc.abstractmethod
  def run_round(
      self, server_state, store: client_state_store.ClientStateStore,
      round_input: RoundInput, *, users_per_client: int = 1,
      cohort_size: Optional[int] = None,
  ) -> RoundResult:
    """One round for `round_input.users`, `users_per_client` of them per
    TFF client (`templates.user_groups`), at most `cohort_size` of them at
    once (`templates.cohorts`; None: all); their new states go to
    `store`."""

  @abc.abstractmethod
  def score(self, server_state, store, examples) -> np.ndarray:
    """The scores (logits) of each user's own model for a protocol's
    evaluation examples: for `CandidateItems`, [U, C] for its items [U, C]
    or [U, I] for every item; for `FeatureRows`, [N]."""

  def summary_fields(self, server_state, store, history: list) -> dict:
    """The method's fields of the run's summary, from its state and the
    history (one dict per round, `RoundResult.metrics` included)."""
    del server_state, store, history
    return {}

  def results_rows(self, summary: dict) -> list[tuple[str, str]]:
    """(name, value) rows of the method's figures in the printed results,
    read from the run's summary (its `summary_fields`)."""
    del summary
    return []

  def config_summary(self) -> dict:
    """What was built (its hyperparameters), for the summary's config."""
    return {}

  def description(self) -> str:
    """One line on what was built, for the start of a run's log."""
    return ''

  def on_device_tiers(self) -> list[str]:
    """The tiers whose global model a phone can download."""
    return []

  def on_device_tier_model(self, server_state, store,
                           tier: str) -> OnDeviceModel:
    """The global model of `tier` (one of `on_device_tiers`)."""
    raise ValueError(f'This method has no global model for tier {tier!r}.')

  def on_device_user_model(self, server_state, store,
                           user: int) -> OnDeviceModel:
    """User `user`'s own model, everything baked in, as it is scored."""
    del server_state, store
    raise ValueError(f'This method exports no model of user {user} for a '
                     'phone.')


def bytes_summary(history: list, store) -> dict:
  """The summary of a method that counts its bytes each round.

  bytes_per_round: the median over rounds of the bytes each way;
  measured_compression_rate: 1 - bytes sent / bytes of the uncompressed
    exchange, over all rounds, each way (0 for methods that do not
    compress), and for the download also per message applied
    (`downlink_per_message`: without catch-up and resyncs; nan if no
    client applied a message);
  client_state_bytes_per_user: the store's mean.
  """
  def total(key):
    return sum(row[key] for row in history)

  rates = {
      direction: 1.0 - total(f'{key}_bytes') / total(f'dense_{key}_bytes')
      for direction, key in (('uplink', 'upload'), ('downlink', 'download'),
                             ('downlink_per_message', 'message_download'))
      if total(f'dense_{key}_bytes')
  }
  rates.setdefault('downlink_per_message', float('nan'))
  return {
      'bytes_per_round': {
          'download': statistics.median(
              row['download_bytes'] for row in history),
          'upload': statistics.median(row['upload_bytes'] for row in history),
      },
      'measured_compression_rate': rates,
      'client_state_bytes_per_user': store.bytes_per_user(),
  }


def bytes_rows(summary: dict) -> list[tuple[str, str]]:
  """The results rows of `bytes_summary`'s fields."""
  rows = [('client state per user',
           f'{summary["client_state_bytes_per_user"] / 1024:.1f} KiB')]
  sent = summary['bytes_per_round']
  rate = summary['measured_compression_rate']
  line = f'{sent["upload"] / 1e6:.3f} / {sent["download"] / 1e6:.3f} MB'
  if rate.get('uplink') or rate.get('downlink'):
    line += (f'; measured compression {rate["uplink"]:.4f} / '
             f'{rate["downlink"]:.4f} (downlink per message '
             f'{rate["downlink_per_message"]:.4f})')
  rows.append(('bytes per round up / down (median)', line))
  return rows


def downlink_summary(history: list) -> dict:
  """{'downlink': the mean over rounds of each `downlink_<name>` figure a
  method reports (FedRAS: group_count, mean_cosine, similarity_at_expected:
  its Fig. 5b and Sec. 5.4.2)}, or {} if it reports none."""
  keys = sorted({key for row in history for key in row
                 if key.startswith('downlink_')})
  if not keys:
    return {}
  return {'downlink': {
      'mean_' + key[len('downlink_'):]: statistics.fmean(
          row[key] for row in history if key in row)
      for key in keys
  }}


def tier_upload_figures(client_metrics, tier_names) -> dict:
  """A round's `upload_bytes_per_client_<tier>` figures from the summed
  client metrics `tier_upload_bytes` / `tier_users` (float [tiers], a
  client work that encodes uploads by device tier), for each tier with a
  user in the round; {} when the client work reports none."""
  if 'tier_upload_bytes' not in client_metrics:
    return {}
  sent = np.asarray(client_metrics['tier_upload_bytes'])
  users = np.asarray(client_metrics['tier_users'])
  return {f'upload_bytes_per_client_{name}': float(sent[t] / users[t])
          for t, name in enumerate(tier_names) if users[t] > 0}


def tier_upload_summary(history: list) -> dict:
  """{'upload_bytes_per_client': {tier: the median over rounds of its
  `upload_bytes_per_client_<tier>`}}, tiers in the order they first
  appear (a tier no client of which trained sends nothing), or {} if no
  round has these figures."""
  prefix = 'upload_bytes_per_client_'
  names = list(dict.fromkeys(
      key[len(prefix):] for row in history for key in row
      if key.startswith(prefix)))
  return {'upload_bytes_per_client': {
      name: statistics.median(row[prefix + name] for row in history
                              if prefix + name in row)
      for name in names}} if names else {}


def tier_upload_rows(summary: dict) -> list[tuple[str, str]]:
  """The results row of `tier_upload_summary`'s field, if any."""
  sent = summary.get('upload_bytes_per_client')
  if not sent:
    return []
  return [('upload bytes per client ' + ' / '.join(sent),
           ' / '.join(f'{v / 1e3:.1f} kB' for v in sent.values()))]
