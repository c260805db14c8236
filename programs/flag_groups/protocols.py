"""Flags of the two protocols (groups `leave_one_out` and `random_split`;
a run takes its method's protocol's)."""

from absl import flags

from tff_fedrec.programs.flag_groups import group
from tff_fedrec.tasks import leave_one_out
from tff_fedrec.tasks import random_split

EVAL_NEGATIVES = flags.DEFINE_integer(
    'num_eval_negatives', 99,
    'Leave-one-out: sampled negatives per validation / test item.'
)
NEGATIVE_POOL = flags.DEFINE_enum(
    'negative_pool', 'never_interacted', list(leave_one_out.NEGATIVE_POOLS),
    'Leave-one-out: where training negatives come from. never_interacted '
    '(the papers\' reference code): items the user never interacted with, '
    'so the held-out items are never training negatives while the items '
    'they are ranked against are; outside_training (leak-free): items '
    'outside the user\'s training items, held-out items included.',
)
TRAINING_NEGATIVES = flags.DEFINE_enum(
    'training_negatives', 'per_round', list(random_split.TRAINING_NEGATIVES),
    'Random split: per_round redraws a user\'s --num_negatives negatives '
    'per positive every round it is selected; once draws them once for the '
    'run (as the first author\'s public FedRec code does).',
)

GROUPS = (
    group.FlagGroup(
        'leave_one_out', 'the leave-one-out protocol (1 + 99 ranking)',
        (EVAL_NEGATIVES, NEGATIVE_POOL),
        check=lambda entry: group.require_positive(EVAL_NEGATIVES),
    ),
    group.FlagGroup(
        'random_split', 'the 80/20 random-split protocol (full ranking)',
        (TRAINING_NEGATIVES,),
    ),
)
