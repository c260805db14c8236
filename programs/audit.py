r"""The protocol audit: what a model that shares nothing reaches on your
data, protocol and negative pool, before you trust a federated figure.

It builds the split and the protocol exactly as a training run of the same
flags does, then trains a memorizer (a private score per user and item,
trained on each user's own positives and sampled negatives of every round,
no sharing) and scores the popularity ranking, and prints both beside
chance in the protocol's metrics (`tasks.floors`). Its output ends with
one line per floor in the protocol's own metric and a line starting
`WARNING:` for each suspicious floor: the memorizer passing chance by a
margin (the protocol rewards remembering negatives) or the popularity
ranking.

  python -m tff_fedrec.programs.audit --dataset=ml-100k \
      --protocol=leave_one_out --negative_pool=never_interacted --rounds=100

Flags are the training program's data, run, tier and protocol flags (a
run's --flagfile works); --protocol picks leave_one_out (HR@10) or
random_split (Recall@20). A click-through protocol has no sampled
negatives to remember: there is nothing to audit.
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app
from absl import flags

from tff_fedrec.algorithms import registry
from tff_fedrec.programs import training_program
from tff_fedrec.programs.flag_groups import data as data_flags
from tff_fedrec.programs.flag_groups import group
from tff_fedrec.programs.flag_groups import run as run_flags
from tff_fedrec.programs.flag_groups import (
    tier_optimization as tier_optimization_flags)
from tff_fedrec.tasks import datasets
from tff_fedrec.tasks import errors
from tff_fedrec.tasks import floors

_RANKING_PROTOCOLS = (registry.LEAVE_ONE_OUT, registry.RANDOM_SPLIT)
PROTOCOL = flags.DEFINE_enum(
    'protocol', registry.LEAVE_ONE_OUT, list(_RANKING_PROTOCOLS),
    'The protocol to audit: leave_one_out (HR@10 among sampled negatives, '
    'PFedRec\'s) or random_split (Recall@20 by full ranking, '
    'HeteFedRec\'s).')

# The training program's groups an audit reads whose checks need no
# method; of --tier_optimization only the client selection applies.
_GROUPS = ('data', 'tiers')


def audit() -> dict:
  """The floors of the flags' data and protocol (`floors.floors`)."""
  for name in (*_GROUPS, PROTOCOL.value):
    training_program.GROUPS[name].check(None)
  tier_optimization_flags.optimization()
  group.require_positive(run_flags.ROUNDS)
  data_config = data_flags.data_config(run_flags.SEED.value)
  interactions = datasets.load_interactions(data_config)
  data = training_program.protocol_flags.PROTOCOLS[PROTOCOL.value].split(
      data_config, interactions)
  protocol, _ = training_program.protocol_of(PROTOCOL.value, data)
  print(f'{PROTOCOL.value} on {data_config.data_path or data_config.dataset}:'
        f' {data.num_users} users, {data.num_items} items; memorizer over '
        f'{run_flags.ROUNDS.value} rounds of {protocol.clients_per_round} '
        'users', flush=True)
  return floors.floors(protocol, run_flags.ROUNDS.value)


def report(result: dict) -> str:
  """Every figure of each floor, then `floors.lines`."""
  metric = result['metric']
  rows = []
  for floor in ('memorizer', 'popularity'):
    figures = '  '.join(f'{name} {value:.4f}'
                        for name, value in result[floor].items()
                        if isinstance(value, float))
    rows.append(f'{floor:<11} {figures}')
  rows.append(f'{"chance":<11} {metric} {result["chance"][metric]:.4f}')
  return '\n'.join([*rows, '', *floors.lines(result)])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  try:
    print(report(audit()), flush=True)
  except (group.FlagError, errors.DataFormatError, errors.DatasetFetchError,
          ValueError) as error:
    print(f'error: {error}', file=sys.stderr, flush=True)
    sys.exit(2)


if __name__ == '__main__':
  app.run(main, argv=training_program.flagfiles_first(sys.argv))
