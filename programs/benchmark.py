r"""Benchmark: accuracy, seconds per round, memory and bytes for each method.

Runs the real training program once per method (a fresh process each, so peak
memory is per method) and prints one table from their summary.json files:

  python -m tff_fedrec.programs.benchmark --dataset=ml-100k --rounds=100 \
      --methods=pfedrec,fedmf,fedncf --root_dir=runs/benchmark

Paper figures (PFedRec Table 2, ML-100K, HR@10 / NDCG@10): PFedRec 71.62 /
43.44, FedMF 65.15 / 39.38, FedNCF 60.62 / 33.25.

The tiered methods (HeteFedRec and its baselines) print Recall@20 / NDCG@20
overall and per tier, and the bytes each tier's clients move:

  python -m tff_fedrec.programs.benchmark --dataset=ml-1m --rounds=960 \
      --methods=hetefedrec,all_small,all_large --root_dir=runs/hetero

Paper figures (HeteFedRec Table II, ML-1M, Fed-NCF, Recall@20 / NDCG@20):
HeteFedRec 0.02662 / 0.04781, All Small 0.02203 / 0.04328, All Large
0.02558 / 0.04028, All Large/Exclusive 0.00956 / 0.01753, Clustered
0.01712 / 0.02235, Directly Aggregate 0.01177 / 0.02207.
"""

import json
import os
import re
import subprocess
import sys

from absl import app
from absl import flags

from tff_fedrec.programs import benchmark_tables
from tff_fedrec.programs import preset_files
from tff_fedrec.programs.flag_groups import group

_METHODS = flags.DEFINE_list(
    'methods', ['pfedrec', 'fedmf', 'fedncf'], 'Methods to run.'
)
_DATASET = flags.DEFINE_string('dataset', 'ml-100k', 'Data set.')
_ROUNDS = flags.DEFINE_integer('rounds', 100, 'Rounds per method.')
_ROOT_DIR = flags.DEFINE_string(
    'root_dir', 'runs/benchmark', 'One sub-directory per method goes here.'
)
_EXTRA = flags.DEFINE_string(
    'extra_flags', '',
    'More flags for every run, separated by commas, e.g. '
    '--extra_flags=--model=lightgcn,--tier_ratio=1,1,1. A comma starts a new '
    'flag only where "--" follows it, so list values keep their commas.',
)
_SEEDS = flags.DEFINE_list(
    'seeds', [],
    'Run every method once per seed (--seed=S, in <root_dir>/<method>/'
    'seed_S), print each seed, the mean over seeds, the best method of '
    'each seed and the first method\'s paired difference from each other '
    'one. Empty: one run per method with its preset\'s seed.',
)

def _method_flags(method: str) -> list[str]:
  """The flags of `method`'s preset (`preset_files`), or the defaults."""
  return preset_files.preset_flags(method, _DATASET.value)


def _split_extra_flags(value: str) -> list[str]:
  """--extra_flags split into flags: at each comma followed by '--'."""
  return re.split(r',(?=--)', value) if value else []


@flags.validator('extra_flags')
def _check_extra_flags(value):
  malformed = [f for f in _split_extra_flags(value) if not f.startswith('--')]
  if malformed:
    raise flags.ValidationError(
        f'--extra_flags holds {malformed[0]!r}, which is not a flag: give '
        'flags as --name=value, separated by commas.'
    )
  return True


flags.register_validator('methods', group.check_method_names)


def _extra_flags() -> list[str]:
  return _split_extra_flags(_EXTRA.value)


def _run(method: str, seed: int | None) -> dict:
  """Trains (or resumes) one run and returns its summary."""
  root_dir = os.path.join(_ROOT_DIR.value, method)
  seed_flags = []
  if seed is not None:
    root_dir = os.path.join(root_dir, f'seed_{seed}')
    seed_flags = [f'--seed={seed}']
  command = [
      sys.executable, '-m', 'tff_fedrec.programs.train',
      *_method_flags(method), f'--method={method}',
      f'--dataset={_DATASET.value}', f'--rounds={_ROUNDS.value}',
      f'--root_dir={root_dir}', *_extra_flags(), *seed_flags,
  ]
  print('$', ' '.join(command), flush=True)
  status = subprocess.run(command, check=False).returncode
  if status != 0:
    # The train program has named the problem above; a crashed run resumes
    # from its last checkpoint when the benchmark is run again.
    ended = (f'was killed by signal {-status}' if status < 0
             else f'exited with status {status}')
    print(
        f'error: the {method} run'
        + (f' (seed {seed})' if seed is not None else '')
        + f' {ended}; its error is above. Runs that finished are kept, and '
        'running the benchmark again resumes the rest.',
        file=sys.stderr, flush=True,
    )
    sys.exit(status if status > 0 else 1)
  with open(os.path.join(root_dir, 'summary.json')) as f:
    return json.load(f)


def _seeds() -> list[int | None]:
  if not _SEEDS.value:
    return [None]  # The preset's seed.
  if any(f.startswith('--seed=') for f in _extra_flags()):
    raise app.UsageError('Give --seeds or --extra_flags=--seed=S, not both.')
  return [int(seed) for seed in _SEEDS.value]


def _print_table(runs: dict, seeds: list, tiered: bool) -> None:
  if tiered:
    print(f'\n{_DATASET.value}: test metrics after the last round')
    header, row, metrics = (
        benchmark_tables.tiered_header, benchmark_tables.tiered_row,
        ('recall@20', 'ndcg@20'),
    )
  else:
    print(f'\n{_DATASET.value}: test metrics at the best validation round')
    header, row, metrics = (
        benchmark_tables.leave_one_out_header,
        benchmark_tables.leave_one_out_row, ('hr@10', 'ndcg@10'),
    )
  print(header())
  for method, summaries in runs.items():
    if len(seeds) == 1:
      print(row(method, summaries[0]))
      continue
    for seed, summary in zip(seeds, summaries):
      print(row(f'{method} seed {seed}', summary))
    print(row(f'{method} mean of {len(seeds)}',
              benchmark_tables.mean_summary(summaries)))
  if len(seeds) > 1 and len(runs) > 1:
    for metric in metrics:
      best = benchmark_tables.leaders(runs, metric)
      print(f'highest {metric} by seed: ' + ', '.join(
          f'{seed} {method}' for seed, method in zip(seeds, best)))
    # The first method named is the one the others are compared with.
    first, *others = runs
    for metric in metrics:
      for other in others:
        print(benchmark_tables.paired_difference_line(
            first, other, metric, benchmark_tables.paired_difference(
                runs[first], runs[other], metric)))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  seeds = _seeds()
  runs = {
      method: [_run(method, seed) for seed in seeds]
      for method in _METHODS.value
  }
  # Tiered methods (HeteFedRec's protocol) and leave-one-out ones (PFedRec's)
  # report different metrics: one table each.
  for tiered in (True, False):
    group = {
        method: summaries for method, summaries in runs.items()
        if ('per_tier' in summaries[0]['test']) == tiered
    }
    if group:
      _print_table(group, seeds, tiered)


if __name__ == '__main__':
  app.run(main)
