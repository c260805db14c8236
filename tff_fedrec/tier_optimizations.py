"""RF²'s tier-aware optimisations (Maeng et al., RecSys '22, Sec. 5.2),
as one value: what each device tier (low, mid, high) does to its update or
its model, or which clients are selected.

  none                 nothing (the paired baseline, p = 0)
  exclude_low          Exclude Lo: low-tier clients never train
  overselect:SHARE     Overselect: K (1 + SHARE) clients drawn a round, the
                       extra dropped low tier first (the code; 0.2)
  prune:a,b,c          each tier drops that share of every update's
                       elements (0 keeps all): 0.75,0.5,0 is 1:2:4
  quant:a,b,c          stochastic quantisation to that many bits per tier
                       (32 untouched): 8,16,32 is 1:2:4
  quants:a,b,c         the same with a separate sign bit (QuantS)
  channel:a,b,c        each tier keeps that share of every hidden layer's
                       units (HeteroFL / FjORD): 0.25,0.5,1 is 1:2:4

`PAPER_CONFIGURATIONS` are the paper's 14 (Sec. 5.2, with the code's
values: `../shared/specs/rf2.md` section 2).
"""

import dataclasses
from typing import Optional

from tff_fedrec import tier_codecs

SELECTIONS = ('exclude_low', 'overselect')
_PER_TIER = ('prune', 'quant', 'quants', 'channel')

PAPER_CONFIGURATIONS = (
    'exclude_low', 'overselect:0.2',
    'prune:0.75,0.5,0', 'prune:0.875,0.75,0', 'prune:0.9375,0.75,0',
    'quant:8,16,32', 'quant:4,8,32', 'quant:2,4,32',
    'quants:8,16,32', 'quants:4,8,32', 'quants:2,4,32',
    'channel:0.25,0.5,1', 'channel:0.125,0.25,1', 'channel:0.0625,0.25,1',
)


@dataclasses.dataclass(frozen=True)
class TierOptimization:
  """One optimisation (module docstring).

  Attributes:
    name: Its flag value.
    codecs: Per tier, how its updates are encoded.
    channel_multipliers: Per tier, the share of hidden units it keeps, or
      None (every tier the whole model).
    selection: None, 'exclude_low' or 'overselect'.
    overselect_share: The extra share Overselect draws.
  """

  name: str = 'none'
  codecs: tuple = (tier_codecs.UpdateCodec(),) * 3
  channel_multipliers: Optional[tuple[float, ...]] = None
  selection: Optional[str] = None
  overselect_share: float = 0.0

  @property
  def changes_the_method(self) -> bool:
    """Whether the method itself must apply it (an encoding of the
    uploads, Channel), rather than the protocol's client selection."""
    return (self.channel_multipliers is not None
            or not all(codec.untouched for codec in self.codecs))


def _numbers(kind, text):
  try:
    values = tuple(float(v) for v in text.split(','))
  except ValueError:
    values = ()
  if len(values) != 3:
    raise ValueError(f'{kind} takes three numbers, low,mid,high; got '
                     f'{text!r}.')
  return values


def parse(value: str) -> TierOptimization:
  """The optimisation of a flag value (module docstring); ValueError
  naming what is wrong."""
  kind, _, argument = value.partition(':')
  if kind == 'none' and not argument:
    return TierOptimization()
  if kind == 'exclude_low' and not argument:
    return TierOptimization(value, selection='exclude_low')
  if kind == 'overselect':
    try:
      share = float(argument or '0.2')
    except ValueError:
      share = float('nan')
    if not 0.0 < share <= 1.0:
      raise ValueError(f'overselect takes a share in (0, 1]; got '
                       f'{argument!r}.')
    return TierOptimization(value, selection='overselect',
                            overselect_share=share)
  if kind not in _PER_TIER:
    raise ValueError(
        f'{value!r} is not a tier optimisation: give none, exclude_low, '
        'overselect:SHARE, prune:a,b,c, quant:a,b,c, quants:a,b,c or '
        'channel:a,b,c (low, mid, high).')
  numbers = _numbers(kind, argument)
  if kind == 'channel':
    if not all(0.0 < m <= 1.0 for m in numbers):
      raise ValueError(f'channel shares must be in (0, 1]; got {argument}.')
    return TierOptimization(value, channel_multipliers=numbers)
  return TierOptimization(value, codecs=tuple(
      tier_codecs.UpdateCodec(kind, v) for v in numbers))


def upload_codecs(value: str, user_tiers) -> Optional[tuple]:
  """The per-tier encodings of the uploads of a method without hidden
  layers to thin (every method but RF²'s): the codecs of `value`, or None
  when it encodes nothing (none, or a client selection, which the
  protocol makes). ValueError for Channel, and for codecs without the
  users' tiers."""
  parsed = parse(value)
  if parsed.channel_multipliers is not None:
    raise ValueError(
        f'{value}: Channel keeps a share of each hidden layer\'s units, '
        'which only rf2\'s models (DLRM, DIN) implement; use prune, quant '
        'or quants to shrink this method\'s uploads by tier.')
  if all(codec.untouched for codec in parsed.codecs):
    return None
  if user_tiers is None:
    raise ValueError(f'{value} encodes uploads by device tier: give the '
                     'users\' tiers.')
  return parsed.codecs
