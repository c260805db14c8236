"""Flags of the reference programs on HeteFedRec's protocol (no federation).

`popularity` and `centralized` measure what the tiered methods are compared
against, so they load the same random 80/20 split (`datasets.
load_random_split`) and divide users into the same tiers. Their data flags
live here once, so the two programs cannot drift apart in what they load.
"""

from absl import flags

from tff_fedrec import tiers

from tff_fedrec.tasks import datasets
from tff_fedrec.tasks import preprocessing

DATASET = flags.DEFINE_enum(
    'dataset', 'ml-1m', list(datasets.NAMED_DATASETS), 'Data set.'
)
SEED = flags.DEFINE_integer(
    'seed', 0, 'Seed of the random split (and of training, if any).'
)
TIER_RATIO = flags.DEFINE_list(
    'tier_ratio', ['5', '3', '2'], 'Tier shares, fewest interactions first.'
)


def load_split() -> preprocessing.RandomSplitData:
  """The split the tiered methods train on with the same --dataset/--seed."""
  return datasets.load_random_split(
      datasets.DataConfig(dataset=DATASET.value, seed=SEED.value)
  )


def user_tiers(data: preprocessing.RandomSplitData):
  """Each user's tier: the tier policy of the tiered methods (`tiers.
  ByInteractions`) with --tier_ratio."""
  return tiers.ByInteractions(
      tuple(float(share) for share in TIER_RATIO.value)
  ).assign(data.train_offsets)
