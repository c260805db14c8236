"""Tier-aware client selection, for every protocol (RF², Maeng et al.,
RecSys '22, Sec. 5.2; the authors' code as `../shared/specs/rf2.md`
section 3 reads it): which of the users a protocol would draw train.

  AllClients     every user the protocol draws;
  ExcludeTier    Exclude Lo: tier `tier`'s users never train (they are
                 still evaluated); they leave the pool before the draw;
  Overselect     a round draws int(K (1 + share)) users and drops the
                 extra ones slowest tier first (the code: low, then mid,
                 then high; within a tier from the end of the round's
                 drawn list).

A protocol draws its round's users in one of two ways, both here so that
every protocol applies a selection the same way:

  `epoch_round`   the next slice of an epoch's shuffled queue (RF²'s
                  click-through protocol, HeteFedRec's random split): an
                  epoch has ceil(n / drawn per round) rounds;
  `sampled_round` a uniform sample without replacement each round
                  (PFedRec's leave-one-out), or every user when the
                  round takes them all.

Example:
  >>> selection = ExcludeTier(0)
  >>> pool = selection.queue(np.arange(6), tiers)    # tier-0 users gone
  >>> sampled_round(pool, 2, selection, tiers, rng)  # 2 of the rest
"""

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class AllClients:
  """Every user the protocol draws."""

  description = 'every client'

  def per_round(self, clients_per_round: int) -> int:
    """How many users a round draws to keep `clients_per_round`."""
    return clients_per_round

  def queue(self, clients: np.ndarray, user_tiers) -> np.ndarray:
    """The users that may train, in `clients`' order."""
    del user_tiers
    return clients

  def keep(self, drawn: np.ndarray, user_tiers,
           clients_per_round: int) -> np.ndarray:
    """The drawn users that train this round."""
    del user_tiers, clients_per_round
    return drawn


@dataclasses.dataclass(frozen=True)
class ExcludeTier(AllClients):
  """Exclude Lo: tier `tier`'s users never train."""

  tier: int = 0

  @property
  def description(self) -> str:
    return f'tier {self.tier} excluded from training'

  def queue(self, clients, user_tiers):
    if user_tiers is None:
      raise ValueError('Excluding a tier needs the users\' tiers.')
    return clients[np.asarray(user_tiers)[clients] != self.tier]


@dataclasses.dataclass(frozen=True)
class Overselect(AllClients):
  """Overselect: int(K (1 + share)) drawn, the extra dropped lowest tier
  first (module docstring)."""

  share: float = 0.2

  def __post_init__(self):
    if not 0.0 < self.share <= 1.0:
      raise ValueError(f'The overselection share must be in (0, 1]; got '
                       f'{self.share}.')

  @property
  def description(self) -> str:
    return f'overselect {self.share:g}, slowest tiers dropped'

  def per_round(self, clients_per_round):
    return int(clients_per_round * (1.0 + self.share))

  def keep(self, drawn, user_tiers, clients_per_round):
    extra = drawn.size - clients_per_round
    if extra <= 0:
      return drawn
    if user_tiers is None:
      raise ValueError('Overselection needs the users\' tiers.')
    user_tiers = np.asarray(user_tiers)
    dropped = []
    for tier in np.unique(user_tiers):
      of_tier = np.flatnonzero(user_tiers[drawn] == tier)
      dropped += of_tier[::-1][:extra - len(dropped)].tolist()
      if len(dropped) == extra:
        break
    return np.delete(drawn, dropped)


def epoch_rounds(pool_size: int, drawn_per_round: int) -> int:
  """Rounds of an epoch of a queue of `pool_size` users."""
  return -(-pool_size // drawn_per_round)


def epoch_round(pool: np.ndarray, clients_per_round: int, selection,
                user_tiers, seed: int, round_num: int) -> np.ndarray:
  """Round `round_num`'s users (sorted): the next slice of its epoch's
  queue, `pool` shuffled by (seed, epoch), minus what `selection` drops.

  `pool` is `selection.queue(...)` of the protocol's clients."""
  drawn_per_round = selection.per_round(clients_per_round)
  epoch, position = divmod(round_num,
                           epoch_rounds(pool.size, drawn_per_round))
  order = np.random.default_rng([seed, epoch, 1]).permutation(pool.size)
  start = position * drawn_per_round
  drawn = pool[order[start:start + drawn_per_round]]
  return np.sort(selection.keep(drawn, user_tiers, clients_per_round))


def sampled_round(pool: np.ndarray, clients_per_round: int, selection,
                  user_tiers, rng: np.random.Generator) -> np.ndarray:
  """A round's users (sorted): `selection.per_round(K)` of `pool` (at
  most all of it, shuffled) drawn uniformly without replacement by `rng`,
  minus what `selection` drops; the whole pool, with no draw, when K
  covers it."""
  if clients_per_round >= pool.size:
    drawn = pool
  else:
    drawn = rng.choice(pool, min(selection.per_round(clients_per_round),
                                 pool.size), replace=False)
  return np.sort(selection.keep(drawn, user_tiers, clients_per_round))
