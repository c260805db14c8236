r"""Seconds per round and peak memory of methods by data set and cohort size.

Trains each (method, data set, cohort size) with the method's preset
(`programs/presets/`) through the train program, one fresh process after
another (so each peak is its own), and prints one table from the runs'
summaries: median seconds per round (evaluation of every user included)
and of training alone, the peak resident memory of the program plus its TFF
worker, and the test figures after the last round.

  .venv/bin/python benchmarks/scale.py --methods=pfedrec,fedmf \
      --datasets=ml-100k,ml-1m --cohort_sizes=all,256 --rounds=10 \
      --root_dir=runs/scale

`all` trains a round's users in one computation (a cohort larger than any
round). Nothing else should run on the machine while it measures: the
figures are wall-clock. docs/results/scale.md has the table and commands.
"""

import json
import os
import subprocess
import sys

from absl import app
from absl import flags

from tff_fedrec.programs import preset_files
from tff_fedrec.programs.flag_groups import group

_METHODS = flags.DEFINE_list('methods', ['pfedrec'], 'Methods to run.')
_DATASETS = flags.DEFINE_list('datasets', ['ml-100k'], 'Data sets.')
_COHORT_SIZES = flags.DEFINE_list(
    'cohort_sizes', ['all', '256'],
    'Users trained at once (--cohort_size), or `all`.')
_ROUNDS = flags.DEFINE_integer('rounds', 10, 'Rounds per run.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of every run.')
_ROOT_DIR = flags.DEFINE_string(
    'root_dir', 'runs/scale', 'One sub-directory per run goes here.')
_EXTRA = flags.DEFINE_list(
    'extra_flags', [], 'More flags for every run, e.g. '
    '--extra_flags=--synthetic_users=40 (comma-separated).')

# A cohort of more users than any data set here has: one computation.
_ALL_USERS = 10**9


flags.register_validator('methods', group.check_method_names)


@flags.validator('cohort_sizes')
def _check_cohort_sizes(value):
  for size in value:
    if size != 'all' and not (size.isdigit() and int(size) > 0):
      raise flags.ValidationError(
          f'--cohort_sizes holds {size!r}: give positive integers or `all`.')
  return True


def _run(method: str, dataset: str, cohort_size: str) -> dict:
  """Trains one run (or resumes it) and returns its summary."""
  root_dir = os.path.join(_ROOT_DIR.value, f'{method}_{dataset}_{cohort_size}')
  size = _ALL_USERS if cohort_size == 'all' else int(cohort_size)
  command = [
      sys.executable, '-m', 'tff_fedrec.programs.train',
      *preset_files.preset_flags(method, dataset), f'--method={method}',
      f'--dataset={dataset}', f'--rounds={_ROUNDS.value}',
      f'--seed={_SEED.value}', f'--cohort_size={size}',
      f'--root_dir={root_dir}', *_EXTRA.value,
  ]
  print('$', ' '.join(command), flush=True)
  status = subprocess.run(command, check=False).returncode
  if status != 0:
    print(f'error: the {method} run on {dataset} (cohort {cohort_size}) '
          f'exited with status {status}; its error is above.',
          file=sys.stderr, flush=True)
    sys.exit(status if status > 0 else 1)
  with open(os.path.join(root_dir, 'summary.json')) as f:
    return json.load(f)


def figures(summary: dict) -> str:
  """The test figures after the last round, as `name value` pairs."""
  test = summary.get('test', {})
  return '  '.join(f'{name} {value:.4f}' for name, value in sorted(
      test.items()) if isinstance(value, float))


def main(argv):
  del argv
  rows = []
  for dataset in _DATASETS.value:
    for method in _METHODS.value:
      for cohort_size in _COHORT_SIZES.value:
        rows.append((method, dataset, cohort_size,
                     _run(method, dataset, cohort_size)))
  print(f'\n{"method":<10} {"data set":<10} {"cohort":>7} {"rounds":>6} '
        f'{"s/round":>8} {"train s":>8} {"peak MB":>8}  test')
  for method, dataset, cohort_size, summary in rows:
    print(f'{method:<10} {dataset:<10} {cohort_size:>7} '
          f'{summary["rounds_completed"]:>6} '
          f'{summary["seconds_per_round"]:>8.2f} '
          f'{summary["train_seconds_per_round"]:>8.2f} '
          f'{summary["peak_rss_mb"]:>8.0f}  {figures(summary)}')


if __name__ == '__main__':
  app.run(main)
