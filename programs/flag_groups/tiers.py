"""Flags of the run's tiers of users (group `tiers`, taken by every run).

Every method is given each user's tier (`method.RunData.user_tiers`):
HeteFedRec's methods size their models by it (tier 0 the smallest model),
FedRAS can set bandwidths by it (`--tier_compression_rates`), and every
protocol reports its metrics per tier. The tiers come from the users'
training data size (`--tier_ratio`, HeteFedRec) or from their devices
(`--device_tiers`, RF²: low / mid / high).
"""

from absl import flags

from tff_fedrec import device_tiers
from tff_fedrec import tiers
from tff_fedrec.programs.flag_groups import group

TIER_RATIO = flags.DEFINE_list(
    'tier_ratio', ['5', '3', '2'],
    'small:medium:large shares of users by training data size (HeteFedRec '
    'Table VI: 5,3,2 / 1,1,1 / 2,3,5): every run\'s tiers, by which it '
    'reports its metrics; the tiered methods\' model sizes; FedRAS\'s '
    'tiers for --tier_compression_rates.',
)
DEVICE_TIERS = flags.DEFINE_string(
    'device_tiers', None,
    'Tiers of devices instead of data size (RF², low / mid / high): '
    'round_robin (RF²\'s "Random": users by training examples, most first, '
    'dealt 0, 1, 2, 0, ...) or dirichlet:ALPHA (Algorithm 1: users who '
    'clicked the same items share a device tier, the more so the smaller '
    'ALPHA; Sec. 5.3: 5000, 5, 0.5, 0.05, 0.005, or the level names vlow, '
    'low, mid, high, vhigh), seeded by --seed.',
)


def tier_policy():
  """The tier policy of --device_tiers, or else of --tier_ratio."""
  if DEVICE_TIERS.value is not None:
    # run.flags records every flag, --tier_ratio's default too, so an
    # export or a resume reads it back as given: only another value clashes.
    if TIER_RATIO.value != flags.FLAGS['tier_ratio'].default:
      raise group.FlagError(
          'Give --device_tiers or --tier_ratio, not both: a user has one '
          'tier.')
    try:
      return device_tiers.policy_from_flag(DEVICE_TIERS.value)
    except ValueError as error:
      raise group.FlagError(f'--device_tiers: {error}') from None
  ratio = group.int_list('tier_ratio', TIER_RATIO.value)
  try:
    return tiers.ByInteractions(ratio)
  except ValueError as error:
    raise group.FlagError(f'--tier_ratio: {error}') from None


GROUPS = (
    group.FlagGroup('tiers', 'the tiers of users', (TIER_RATIO, DEVICE_TIERS),
                    check=lambda entry: tier_policy()),
)
