"""Flags of how the item table travels (group `exchange`): the exchange
of PFedRec, FedMF and FedNCF (`--exchange`), LDP, and the compression of
FedRAS and its baselines, whose entries fix their exchange."""

from absl import flags

from tff_fedrec.algorithms.fedras import exchange as fedras_exchange
from tff_fedrec.algorithms.local_items import exchanges
from tff_fedrec.programs.flag_groups import group

# --exchange value -> the exchange's name in registry entries.
_SCHEMES = {'broadcast': 'broadcast', 'fedras': 'fedras', 'topk': 'top_k',
            'svd': 'svd', 'colr': 'colr'}

EXCHANGE = flags.DEFINE_enum(
    'exchange', 'broadcast', list(_SCHEMES),
    'pfedrec, fedmf, fedncf: how the item table travels. broadcast: the '
    'server sends it and clients upload the rows they trained (the papers); '
    'fedras: every client keeps its own copy, updated by FedRAS\'s '
    'clustered actions both ways (Lu et al. 2025); topk, svd, colr: the same '
    'copies with FedRAS\'s baseline codecs.',
)
LDP_NOISE = flags.DEFINE_float(
    'ldp_noise_scale', 0.0,
    'Laplace noise scale lambda on uploaded item embeddings (PFedRec Sec. '
    '6.6); with --exchange=broadcast only.',
)
COMPRESSION_RATE = flags.DEFINE_float(
    'compression_rate', 0.9375,
    'Compressed exchanges: the requested share of bytes saved, 1 - '
    'compressed / dense (FedRAS Sec. 5.1).',
)
ALPHA = flags.DEFINE_float(
    'alpha', fedras_exchange.DEFAULT_ALPHA,
    'FedRAS: the fluctuation factor of cluster-and-split (Sec. 4.3); '
    'fedras_f sets it to 0.',
)
COMPRESSION_RATE_RANGE = flags.DEFINE_list(
    'compression_rate_range', [],
    'FedRAS: LOW,HIGH; each user draws its own rate, hence its bandwidth '
    '(Sec. 5.5, Table 4).',
)
TIER_COMPRESSION_RATES = flags.DEFINE_list(
    'tier_compression_rates', [],
    'FedRAS: SMALL,MEDIUM,LARGE, a requested rate per tier. Users are split '
    'into tiers by training interactions with --tier_ratio (fewest first), '
    'and each user\'s bandwidth e_u follows its tier\'s rate, e.g. '
    '0.97,0.9375,0.8.',
)
CATCH_UP_ROUNDS = flags.DEFINE_integer(
    'catch_up_rounds', fedras_exchange.DEFAULT_CATCH_UP_ROUNDS,
    'Compressed exchanges: rounds of downlink messages the server keeps for '
    'clients that missed rounds; beyond that a client downloads the whole '
    'table.',
)
RESYNC_WHEN_CHEAPER = flags.DEFINE_bool(
    'resync_when_cheaper', False,
    'Compressed exchanges: a returning client downloads the whole table when '
    'the messages it missed would cost more bytes. Off by default: FedRAS\'s '
    'Algorithm 1 has no such download, and a client applies every message '
    'it missed within --catch_up_rounds.',
)

_COMPRESSION = (COMPRESSION_RATE, CATCH_UP_ROUNDS, RESYNC_WHEN_CHEAPER)
_FEDRAS_ONLY = (ALPHA, COMPRESSION_RATE_RANGE, TIER_COMPRESSION_RATES)


def _refuse(holders, why: str) -> None:
  for holder in group.changed_flags(holders):
    raise group.FlagError(f'--{holder.name} {why} Drop the flag.')


def _floats(holder, count: int, example: str) -> tuple[float, ...]:
  try:
    values = tuple(float(v) for v in holder.value)
  except ValueError:
    values = ()
  if len(values) != count:
    raise group.FlagError(
        f'--{holder.name} takes {count} comma-separated rates, e.g. '
        f'{example}; got {",".join(holder.value)}.'
    )
  return values


def _fedras_options() -> fedras_exchange.FedRASOptions:
  rate_range = tier_rates = None
  if COMPRESSION_RATE_RANGE.value:
    rate_range = _floats(COMPRESSION_RATE_RANGE, 2, '0.9,0.97')
  if TIER_COMPRESSION_RATES.value:
    if rate_range is not None:
      raise group.FlagError(
          '--tier_compression_rates and --compression_rate_range both set '
          'per-user bandwidths; give one of them.'
      )
    tier_rates = _floats(TIER_COMPRESSION_RATES, 3, '0.97,0.9375,0.8')
    if not all(0 <= rate < 1 for rate in tier_rates):
      raise group.FlagError(
          '--tier_compression_rates needs 3 rates in [0, 1) (small, medium, '
          f'large); got {",".join(TIER_COMPRESSION_RATES.value)}.'
      )
  return fedras_exchange.FedRASOptions(
      compression_rate=COMPRESSION_RATE.value, alpha=ALPHA.value,
      compression_rate_range=rate_range, tier_compression_rates=tier_rates,
      catch_up_rounds=CATCH_UP_ROUNDS.value,
      resync_when_cheaper=RESYNC_WHEN_CHEAPER.value,
  )


def _scheme(entry) -> str:
  return entry.exchange or _SCHEMES[EXCHANGE.value]


def check(entry) -> None:
  """FlagError for flags `entry`'s exchange does not take or cannot use."""
  fixed = entry.exchange
  if fixed is not None and EXCHANGE.value != 'broadcast':
    raise group.FlagError(
        f'--exchange does not apply to --method={entry.name}, whose '
        f'exchange is {fixed}; --exchange chooses that of pfedrec, fedmf and '
        'fedncf. Drop the flag.'
    )
  scheme = _scheme(entry)
  if not 0 <= COMPRESSION_RATE.value < 1:
    raise group.FlagError(
        '--compression_rate must be in [0, 1); 0 is the least compression '
        'the format allows (FedRAS Table 4\'s "Excellent").'
    )
  group.require_finite(ALPHA)
  if scheme != 'broadcast':
    _refuse((LDP_NOISE,), 'applies to --exchange=broadcast only: a '
            'compressed upload is not noised.')
  if scheme != 'fedras':
    _refuse((ALPHA, COMPRESSION_RATE_RANGE, TIER_COMPRESSION_RATES),
            'applies to fedras only (the baselines give every client one '
            'rate, FedRAS Sec. 5.1).')
  if scheme == 'broadcast':
    _refuse(_COMPRESSION, 'needs a compressed exchange (--exchange=fedras, '
            'topk, svd or colr).')
    if not LDP_NOISE.value >= 0 or LDP_NOISE.value == float('inf'):
      raise group.FlagError(
          'LDP never fails open: --ldp_noise_scale must be a finite '
          f'number >= 0 (0 turns LDP off); got {LDP_NOISE.value}.'
      )
  elif scheme == 'small_dim':
    _refuse((CATCH_UP_ROUNDS, RESYNC_WHEN_CHEAPER), 'does not apply to '
            f'--method={entry.name}: it broadcasts its small table.')
  else:
    group.require_positive(CATCH_UP_ROUNDS)
    if scheme == 'fedras':
      _fedras_options()


def _arguments(context: group.BuildContext) -> dict:
  scheme = _scheme(context.entry)
  if scheme == 'broadcast':
    return {'exchange': exchanges.BroadcastOptions(LDP_NOISE.value)}
  if scheme == 'small_dim':
    return {'compression_rate': COMPRESSION_RATE.value}
  if scheme == 'fedras':
    return {'exchange': _fedras_options()}
  return {'exchange': fedras_exchange.CodecBaselineOptions(
      scheme, compression_rate=COMPRESSION_RATE.value,
      catch_up_rounds=CATCH_UP_ROUNDS.value,
      resync_when_cheaper=RESYNC_WHEN_CHEAPER.value,
  )}


GROUPS = (
    group.FlagGroup(
        'exchange', 'how the item table travels (exchange, LDP, compression)',
        (EXCHANGE, LDP_NOISE, *_COMPRESSION, *_FEDRAS_ONLY), _arguments,
        check,
    ),
)
