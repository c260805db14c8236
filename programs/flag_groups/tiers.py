"""Flags of the run's tiers of users (group `tiers`, taken by every run).

Every method is given each user's tier (`method.RunData.user_tiers`):
HeteFedRec's methods size their models by it, FedRAS can set bandwidths
by it (`--tier_compression_rates`), and every protocol reports its
metrics per tier.
"""

from absl import flags

from tff_fedrec import tiers
from tff_fedrec.programs.flag_groups import group

TIER_RATIO = flags.DEFINE_list(
    'tier_ratio', ['5', '3', '2'],
    'small:medium:large shares of users by training data size (HeteFedRec '
    'Table VI: 5,3,2 / 1,1,1 / 2,3,5): every run\'s tiers, by which it '
    'reports its metrics; the tiered methods\' model sizes; FedRAS\'s '
    'tiers for --tier_compression_rates.',
)


def tier_policy() -> tiers.ByInteractions:
  """The tiers of --tier_ratio."""
  ratio = group.int_list('tier_ratio', TIER_RATIO.value)
  try:
    return tiers.ByInteractions(ratio)
  except ValueError as error:
    raise group.FlagError(f'--tier_ratio: {error}') from None


GROUPS = (
    group.FlagGroup('tiers', 'the tiers of users', (TIER_RATIO,),
                    check=lambda entry: tier_policy()),
)
