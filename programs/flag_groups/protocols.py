"""The protocols a run can take: their flags (groups `leave_one_out` and
`random_split`; a run takes its method's protocol's) and how each splits
the data and is built from the flags (`PROTOCOLS`, keyed by the registry
entries' protocol names), so the program names no protocol.

Example:
  >>> protocol = PROTOCOLS[entry.protocol]
  >>> data = protocol.split(data_config, interactions)
  >>> protocol.build(data, user_tiers, tier_names)
"""

import dataclasses
from typing import Callable

from absl import flags

from tff_fedrec.algorithms import registry
from tff_fedrec.programs.flag_groups import group
from tff_fedrec.programs.flag_groups import run as run_flags
from tff_fedrec.programs.flag_groups import (
    tier_optimization as tier_optimization_flags)
from tff_fedrec.tasks import click_through_protocol
from tff_fedrec.tasks import client_selection
from tff_fedrec.tasks import datasets
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

@dataclasses.dataclass(frozen=True)
class ProtocolFromFlags:
  """How a run's protocol is made from the flags.

  Attributes:
    split: (data config, interactions) -> the split data.
    build: (split data, user tiers, tier names) -> the
      `tasks.protocol.Protocol`.
    clicks: split data -> (offsets, items) of each user's training clicks,
      which a Dirichlet device mapping groups users by, or None where every
      training item is a click.
    split_settings: () -> {flag: value} of the protocol's flags `split`
      reads (with the data config, what a cached split is keyed by:
      `tasks.split_cache`).
  """

  split: Callable
  build: Callable
  clicks: Callable = lambda data: None
  split_settings: Callable = dict


def _leave_one_out(data, user_tiers,
                   tier_names) -> leave_one_out.LeaveOneOut:
  return leave_one_out.LeaveOneOut(
      data,
      clients_per_round=(run_flags.clients_per_round(data.num_users)
                         or data.num_users),
      negatives_per_positive=run_flags.NEGATIVES.value,
      negative_pool=NEGATIVE_POOL.value, user_tiers=user_tiers,
      tier_names=tier_names, selection=_selection(),
      seed=run_flags.SEED.value,
  )


def _random_split(data, user_tiers,
                  tier_names) -> random_split.RandomSplit:
  return random_split.RandomSplit(
      data, user_tiers=user_tiers, tier_names=tier_names,
      clients_per_round=run_flags.clients_per_round(data.num_users),
      negatives_per_positive=run_flags.NEGATIVES.value,
      training_negatives=TRAINING_NEGATIVES.value, selection=_selection(),
      seed=run_flags.SEED.value,
  )


def _selection():
  """The client selection of --tier_optimization (`client_selection`)."""
  optimization = tier_optimization_flags.optimization()
  if optimization.selection == 'exclude_low':
    return client_selection.ExcludeTier(0)
  if optimization.selection == 'overselect':
    return client_selection.Overselect(optimization.overselect_share)
  return client_selection.AllClients()


def _click_through(data, user_tiers,
                   tier_names) -> click_through_protocol.ClickThrough:
  return click_through_protocol.ClickThrough(
      data, user_tiers=user_tiers, tier_names=tier_names,
      clients_per_round=run_flags.clients_per_round(data.num_users),
      selection=_selection(),
      seed=run_flags.SEED.value,
  )


PROTOCOLS = {
    registry.LEAVE_ONE_OUT: ProtocolFromFlags(
        split=lambda config, interactions: datasets.split_leave_one_out(
            config, interactions,
            num_eval_negatives=EVAL_NEGATIVES.value),
        build=_leave_one_out,
        split_settings=lambda: {'num_eval_negatives': EVAL_NEGATIVES.value},
    ),
    registry.RANDOM_SPLIT: ProtocolFromFlags(
        split=datasets.split_random, build=_random_split,
    ),
    registry.CLICK_THROUGH: ProtocolFromFlags(
        split=datasets.split_click_through, build=_click_through,
        clicks=lambda data: data.training_clicks(),
    ),
}

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
    group.FlagGroup(
        'click_through', 'the click-through protocol (AUC per device tier)',
        (),
    ),
)
