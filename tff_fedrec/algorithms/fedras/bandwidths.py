"""Each user's bandwidth e_u in item rows (FedRAS Sec. 4.1, 5.1, 5.5).

FedRAS (Lu et al., KDD 2025) sizes every message by its client's bandwidth
e_u: a client uploads at most e_u actions (rows or centroids), and the
server's cluster-and-split sends each client the groups it can take.
"""

import dataclasses
from typing import Optional

import numpy as np

from tff_fedrec.algorithms.fedras import compression


@dataclasses.dataclass(frozen=True)
class ClientBandwidths:
  """Each user's bandwidth e_u in item rows (Sec. 4.1, 5.1, 5.5).

  Homogeneous (the paper's main runs, Sec. 5.1): e_u = C_e for all, the
  FedRAS action count whose message meets `compression_rate`
  (`compression.pick_parameter('fedras', N, d, rate)`, counting
  the group indices; the paper's N (1 - CR) omits them). Heterogeneous
  (Sec. 5.5): user u draws its rate CR_u uniformly from
  `compression_rate_range` once (seeded by (seed, u), so every round and a
  resumed run agree), and e_u is the action count for CR_u; C_e is that of
  the range's middle ("related to the median"). Given per user
  (`user_rates`, e.g. one rate per device tier, Sec. 4.1): e_u is the
  action count for user u's rate, and C_e that of the users' median rate.

  Example: N = 1682, d = 32, rate 0.9375: e_u = C_e = 92 for every user.
  """

  num_items: int
  dim: int
  compression_rate: float
  compression_rate_range: Optional[tuple[float, float]] = None
  seed: int = 0
  user_rates: Optional[tuple[float, ...]] = None
  _cache: dict = dataclasses.field(
      default_factory=dict, compare=False, repr=False
  )

  def __post_init__(self):
    if self.compression_rate_range is not None:
      low, high = self.compression_rate_range
      if not 0.0 <= low <= high < 1.0:
        raise ValueError(
            'compression_rate_range must be (low, high) with 0 <= low <= '
            f'high < 1; got {self.compression_rate_range}.'
        )
    if self.user_rates is not None:
      if self.compression_rate_range is not None:
        raise ValueError(
            'Give either compression_rate_range or user_rates, not both.'
        )
      rates = np.asarray(self.user_rates, np.float64)
      if rates.ndim != 1 or not rates.size:
        raise ValueError('user_rates must hold one rate per user.')
      if not np.all((rates >= 0.0) & (rates < 1.0)):
        raise ValueError(
            f'user_rates must lie in [0, 1); got {rates.min()} to '
            f'{rates.max()}.'
        )

  def _actions(self, rate: float) -> int:
    return compression.pick_parameter(
        'fedras', self.num_items, self.dim, rate
    )

  @property
  def expected_groups(self) -> int:
    """C_e."""
    if self.user_rates is not None:
      return self._actions(float(np.median(self.user_rates)))
    if self.compression_rate_range is None:
      return self._actions(self.compression_rate)
    return self._actions(sum(self.compression_rate_range) / 2)

  @property
  def smallest(self) -> int:
    """The smallest e_u any user can have."""
    if self.user_rates is not None:
      return self._actions(max(self.user_rates))
    if self.compression_rate_range is None:
      return self.expected_groups
    return self._actions(self.compression_rate_range[1])

  def _rate(self, user: int) -> float:
    """User u's rate: given, or drawn from the range seeded by (seed, u)."""
    if self.user_rates is not None:
      return float(self.user_rates[user])
    low, high = self.compression_rate_range
    return float(
        np.random.default_rng([self.seed, int(user)]).uniform(low, high)
    )

  def __call__(self, users) -> np.ndarray:
    """int32 [len(users)]: e_u of each user id."""
    if self.user_rates is None and self.compression_rate_range is None:
      return np.full([len(users)], self.expected_groups, np.int32)
    users = np.asarray(users, np.int64)
    if self.user_rates is not None and users.size and not (
        0 <= users.min() <= users.max() < len(self.user_rates)
    ):
      raise ValueError(
          f'user ids must lie in [0, {len(self.user_rates)}), the users '
          'with a rate.'
      )
    values = []
    for user in users:
      rate = self._rate(user)
      if rate not in self._cache:
        self._cache[rate] = self._actions(rate)
      values.append(self._cache[rate])
    return np.asarray(values, np.int32)
