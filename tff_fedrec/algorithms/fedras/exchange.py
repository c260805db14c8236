"""FedRAS's exchange and its baselines', as options any local-item method
takes (`compressed_exchange.CompressedExchange`, `NarrowBroadcastExchange`).

FedRAS ("Gradients as an Action", Lu et al., KDD 2025) sends item-embedding
updates as shared actions, both ways: the k-means centroids of the gradient
rows plus a group index per row (Sec. 4.2). A client uploads its rows
clustered into at most e_u actions (its bandwidth in rows, Alg. 1 lines
26-29); the server averages each item over the clients that trained it
(Sec. 4.4) and sends the aggregate compressed by adaptive cluster-and-split
(Sec. 4.3), one matrix per bandwidth; every client keeps its own copy of
the item table and applies the actions it receives (line 24).

  FedRASOptions        FedRAS, its ablations E (cluster embeddings), F
                       (alpha = 0: fixed k) and T (FedAvg aggregation) of
                       Sec. 5.4.1, per-user bandwidths from a range (Sec.
                       5.5) or from rates per tier.
  NarrowBroadcastOptions  "Base" of Sec. 5.1: a broadcast of a narrower
                       table, its bytes counted against the full width.
  CodecBaselineOptions Topk, SVD and CoLR of Sec. 5.1: the same client
                       copies, catch-up and byte accounting, and FedAvg
                       aggregation ("the classical FL algorithm FedAvg").
                       Their download has the k or rank
                       `compression.pick_parameter` gives the
                       [N, d] table at the rate; their uploads get FedRAS's
                       per-user byte budget (`row_codecs.upload_budget`).

Each has `build(num_items=, embedding_dim=, seed=, user_tiers=)`, the
exchange for a model of that size, so the same options serve FedMF,
FedNCF and PFedRec (`--exchange`).

Interpretations of the paper:
  - e_u and C_e come from `pick_parameter('fedras', N, d, CR)`, which
    counts the group indices the paper leaves out (Sec. 5.1); C_e = 92
    instead of N (1 - CR) = 105 for ML-100K at CR = 93.75%.
  - A client away from rounds catches up on every message it missed, up
    to H = `catch_up_rounds` rounds kept by the server, and downloads the
    server's table in full beyond that, or, with `resync_when_cheaper`
    (an option, not in Algorithm 1), as soon as the missed messages cost
    more bytes than the table; its download bytes count them all.
    Algorithm 1 shows one message per round, as if every client were
    present every round.
  - FedRAS-E uploads clustered trained embeddings; the server sets each
    trained item to the participation mean of the decoded rows and sends
    the whole table clustered; clients replace their copies.
  - The paper sets one rate for every method and no per-user rule for the
    baselines' uploads. Each user's upload gets the bytes its FedRAS upload
    would take, 4 min(T_u, e_u) d + T_u index_bytes(min(T_u, e_u) + 1),
    and the largest k or rank that fits (`row_codecs.budget_parameter`),
    so measured uplink rates match FedRAS's.
  - CoLR's client trains A through the loss as the authors' public code
    does: its item-row gradients are mapped into the row space of the
    round's shared B, scaled by sqrt(d / r_u)
    (`compression.colr_gradient_map`); unlike that code, the
    baselines aggregate by FedAvg, as the paper compares them.

Example:
  >>> exchange = FedRASOptions(compression_rate=0.9375).build(
  ...     num_items=1682, embedding_dim=32, seed=0)
  >>> exchange.bandwidths.expected_groups  # C_e for ML-100K, d = 32
  92
"""

import dataclasses
from typing import Optional

import numpy as np

from tff_fedrec import clustering
from tff_fedrec.algorithms.fedras import bandwidths as bandwidths_lib
from tff_fedrec.algorithms.fedras import compressed_exchange
from tff_fedrec.algorithms.fedras import compression
from tff_fedrec.algorithms.fedras import downlink_codecs
from tff_fedrec.algorithms.fedras import row_codecs
from tff_fedrec.algorithms.local_items import exchanges

ABLATIONS = ('E', 'F', 'T')
DEFAULT_ALPHA = 0.2  # Sec. 5.1.
DEFAULT_CATCH_UP_ROUNDS = 32


@dataclasses.dataclass(frozen=True)
class FedRASOptions:
  """FedRAS's exchange (module docstring).

  Attributes:
    compression_rate: CR of Sec. 5.1 (1 - bytes / dense bytes of the
      [N, d] table); sets C_e and every e_u.
    alpha: The fluctuation factor of cluster-and-split (Sec. 4.3).
    ablation: None, 'E', 'F' (alpha = 0) or 'T' (Sec. 5.4.1).
    compression_rate_range: (low, high): heterogeneous e_u (Sec. 5.5).
    tier_compression_rates: (small, medium, large): each user's rate by its
      tier (`RunData.user_tiers`); exclusive with the range.
    catch_up_rounds: H, how many rounds of messages the server keeps.
    resync_when_cheaper: A returning client downloads the table when its
      missed messages would cost more (`downlink.catch_up`); not in
      Algorithm 1, off by default.
    num_iterations: Lloyd steps of every k-means.
  """

  compression_rate: float = 0.9375
  alpha: float = DEFAULT_ALPHA
  ablation: Optional[str] = None
  compression_rate_range: Optional[tuple[float, float]] = None
  tier_compression_rates: Optional[tuple[float, float, float]] = None
  catch_up_rounds: int = DEFAULT_CATCH_UP_ROUNDS
  resync_when_cheaper: bool = False
  num_iterations: int = clustering.DEFAULT_LLOYD_ITERATIONS

  def __post_init__(self):
    if self.ablation is not None and self.ablation not in ABLATIONS:
      raise ValueError(f'ablation must be None or one of {ABLATIONS}.')
    if not 0 <= self.compression_rate < 1:
      raise ValueError(
          f'compression_rate must be in [0, 1); got {self.compression_rate}.'
      )
    if self.tier_compression_rates is not None:
      rates = np.asarray(self.tier_compression_rates, np.float64)
      if rates.shape != (3,) or not np.all((rates >= 0) & (rates < 1)):
        raise ValueError(
            'tier_compression_rates needs 3 rates in [0, 1) (small, medium, '
            f'large); got {self.tier_compression_rates}.'
        )

  def user_rates(self, user_tiers) -> Optional[np.ndarray]:
    """float [U]: each user's rate from its tier, or None."""
    if self.tier_compression_rates is None:
      return None
    if user_tiers is None:
      raise ValueError('tier_compression_rates needs the users\' tiers.')
    return np.asarray(self.tier_compression_rates, np.float64)[
        np.asarray(user_tiers)
    ]

  def bandwidths(self, num_items: int, embedding_dim: int, seed: int,
                 user_tiers=None) -> bandwidths_lib.ClientBandwidths:
    rates = self.user_rates(user_tiers)
    return bandwidths_lib.ClientBandwidths(
        num_items, embedding_dim, self.compression_rate,
        self.compression_rate_range, seed,
        user_rates=None if rates is None else tuple(float(r) for r in rates),
    )

  def build(self, *, num_items: int, embedding_dim: int, seed: int,
            user_tiers=None) -> compressed_exchange.CompressedExchange:
    alpha = 0.0 if self.ablation == 'F' else self.alpha
    bandwidths = self.bandwidths(num_items, embedding_dim, seed, user_tiers)
    downlink_codec = downlink_codecs.ClusteredActionsDownlink(
        num_items, embedding_dim,
        expected_groups=bandwidths.expected_groups, alpha=alpha,
        num_iterations=self.num_iterations,
    )
    most = downlink_codec.most_groups(bandwidths.smallest)
    if downlink_codec.initial_groups > most:
      raise ValueError(
          f'C_e (1 - alpha) = {downlink_codec.initial_groups} groups exceeds '
          f'the {most} groups the smallest bandwidth, '
          f'{bandwidths.smallest} rows, takes: raise alpha (Sec. 5.5 adjusts '
          'it to the range).'
      )
    return compressed_exchange.CompressedExchange(
        num_items=num_items,
        upload_codec=row_codecs.ClusteredActions(self.num_iterations),
        downlink_codec=downlink_codec,
        bandwidths=bandwidths,
        normalization='clients' if self.ablation == 'T' else 'participation',
        exchange_embeddings=self.ablation == 'E',
        catch_up_rounds=self.catch_up_rounds,
        resync_when_cheaper=self.resync_when_cheaper,
        seed=seed,
    )


# scheme -> (upload codec, downlink codec).
_BASELINE_CODECS = {
    'top_k': (row_codecs.TopK, downlink_codecs.TopKDownlink),
    'svd': (row_codecs.Svd, downlink_codecs.SvdDownlink),
    'colr': (row_codecs.Colr, downlink_codecs.ColrDownlink),
}
BASELINE_SCHEMES = tuple(_BASELINE_CODECS)


def baseline_codecs(
    scheme: str, num_items: int, embedding_dim: int, compression_rate: float
):
  """(upload codec, downlink codec) of a baseline (`CodecBaselineOptions`
  describes their parameters)."""
  if scheme not in _BASELINE_CODECS:
    raise ValueError(
        f'scheme must be one of {BASELINE_SCHEMES}; got {scheme!r}.'
    )
  upload, downlink = _BASELINE_CODECS[scheme]
  return upload(), downlink(
      num_items, embedding_dim,
      compression.pick_parameter(
          scheme, num_items, embedding_dim, compression_rate
      ),
  )


@dataclasses.dataclass(frozen=True)
class CodecBaselineOptions:
  """Topk, SVD or CoLR of Sec. 5.1 (`scheme` 'top_k', 'svd' or 'colr').

  Upload: each user's k_u or rank r_u is the largest whose message fits
  the bytes of its FedRAS upload at bandwidth e_u = C_e
  (`row_codecs.TopK`, `Svd`, `Colr`). Download: the k or rank
  `compression.pick_parameter(scheme, N, d, compression_rate)` of
  the [N, d] table. Aggregation is FedAvg.

  Example: N = 24, d = 4, rate 0.78 (C_e = 4): a user with T_u = 7 rows
  has B_u = 4 * 4 * 4 + 7 * 1 = 71 bytes and uploads top-k k_u =
  floor(71 / 35) = 2, svd r_u = floor(71 / 44) = 1 or colr r_u =
  floor(71 / 28) = 2; the download uses k = r = 1.
  """

  scheme: str
  compression_rate: float = 0.9375
  catch_up_rounds: int = DEFAULT_CATCH_UP_ROUNDS
  resync_when_cheaper: bool = False

  def __post_init__(self):
    if self.scheme not in _BASELINE_CODECS:
      raise ValueError(
          f'scheme must be one of {BASELINE_SCHEMES}; got {self.scheme!r}.'
      )
    if not 0 <= self.compression_rate < 1:
      raise ValueError(
          f'compression_rate must be in [0, 1); got {self.compression_rate}.'
      )

  def build(self, *, num_items: int, embedding_dim: int, seed: int,
            user_tiers=None) -> compressed_exchange.CompressedExchange:
    del user_tiers  # One rate for every client (Sec. 5.1).
    upload_codec, downlink_codec = baseline_codecs(
        self.scheme, num_items, embedding_dim, self.compression_rate
    )
    return compressed_exchange.CompressedExchange(
        num_items=num_items,
        upload_codec=upload_codec,
        downlink_codec=downlink_codec,
        bandwidths=bandwidths_lib.ClientBandwidths(
            num_items, embedding_dim, self.compression_rate, None, seed
        ),
        normalization='clients',
        catch_up_rounds=self.catch_up_rounds,
        resync_when_cheaper=self.resync_when_cheaper,
        seed=seed,
    )


@dataclasses.dataclass(frozen=True)
class NarrowBroadcastExchange(exchanges.BroadcastExchange):
  """"Base" of Sec. 5.1: the broadcast of a table of width d' (the model's),
  its bytes counted against the width-d exchange it stands in for: uploads
  4 d' bytes per row (no ids, as the compressed exchanges count), a
  download the whole [N, d'] table, and the uncompressed reference the
  same at width d = `reference_embedding_dim`."""

  reference_embedding_dim: int = 0

  def __post_init__(self):
    super().__post_init__()
    if self.reference_embedding_dim < 1:
      raise ValueError('reference_embedding_dim must be at least 1; got '
                       f'{self.reference_embedding_dim}.')

  def describe(self, num_users: int) -> dict:
    return {**super().describe(num_users),
            'reference_embedding_dim': self.reference_embedding_dim}

  def description(self, num_users: int) -> str:
    return (f'{super().description(num_users)}, bytes against width '
            f'{self.reference_embedding_dim}')

  def round_bytes(self, spec, initial_parameters, metrics,
                  num_clients: int) -> exchanges.RoundBytes:
    theta = exchanges.dense_parameter_bytes(spec, initial_parameters) * (
        num_clients)
    dim = spec.embedding_dim
    uploaded_rows = metrics['aggregator']['item_embedding']['uploaded_rows']
    table = compression.dense_bytes(self.num_items, dim)
    full_table = compression.dense_bytes(
        self.num_items, self.reference_embedding_dim
    )
    upload = compression.FLOAT_BYTES * int(uploaded_rows) * dim + theta
    download = num_clients * table + theta
    dense = num_clients * full_table + theta
    # One message a round: the [N, d'] table, against the [N, d] one.
    return exchanges.RoundBytes(upload, download, dense, dense,
                                num_clients * table, num_clients * full_table)


@dataclasses.dataclass(frozen=True)
class NarrowBroadcastOptions:
  """Options of a `NarrowBroadcastExchange` ("Base", Sec. 5.1)."""

  reference_embedding_dim: int

  def build(self, *, num_items: int, embedding_dim: int, seed: int,
            user_tiers=None) -> NarrowBroadcastExchange:
    del embedding_dim, seed, user_tiers
    return NarrowBroadcastExchange(
        num_items, reference_embedding_dim=self.reference_embedding_dim)
