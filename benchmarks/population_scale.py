r"""Seconds per round and peak memory against the users in the data and the
clients per round: PFedRec on synthetic data up to a million users, its
client state in the on-disk store (issue 43).

Each point (users, clients per round) is one run of the train program in a
fresh process, one after another (so each peak is its own):

  .venv/bin/python benchmarks/population_scale.py \
      --points=10000:10000,100000:10000,1000000:10000,1000000:1000,1000000:50000 \
      --rounds=4 --root_dir=runs/population_scale

and prints a table: the median seconds of training a round (rounds 2 on:
the first traces the TFF computations; evaluation, which scores every
user, is not in it and runs once, after the last round), the peak resident
memory of the program and its TFF worker over the whole run (evaluation
included), the bytes the last checkpoint wrote (the database's growth
and the program state's files) and the database's size. With --plot it
also draws them (PNG): seconds and memory by users at the first points'
clients, and by clients at the largest population.

The first run of a population makes its split (minutes at a million users)
and caches it (`tasks.split_cache`); later runs map it. Nothing else
should run on the machine while it measures: the figures are wall-clock.
docs/results/scale.md has the table, the plot and the commands.
"""

import csv
import json
import os
import statistics
import subprocess
import sys

from absl import app
from absl import flags

_POINTS = flags.DEFINE_list(
    'points',
    ['10000:10000', '100000:10000', '1000000:10000', '1000000:1000',
     '1000000:50000'],
    'users:clients_per_round of each run.')
_ITEMS = flags.DEFINE_integer('items', 1000, '--synthetic_items of each run.')
_ROUNDS = flags.DEFINE_integer('rounds', 4, 'Rounds per run (at least 2).',
                               lower_bound=2)
_STORE = flags.DEFINE_enum('client_store', 'disk', ['memory', 'disk'],
                           '--client_store of each run.')
_ROOT_DIR = flags.DEFINE_string(
    'root_dir', 'runs/population_scale', 'One sub-directory per run.')
_PLOT = flags.DEFINE_string('plot', None, 'Write the plot to this PNG.')
_EXTRA = flags.DEFINE_multi_string(
    'extra_flag', [], 'One more flag for every run, repeatable: e.g. '
    '--extra_flag=--executor=remote '
    '--extra_flag=--workers=127.0.0.1:18701,127.0.0.1:18702')


def _point(text: str) -> tuple[int, int]:
  try:
    users, clients = (int(part) for part in text.split(':'))
  except ValueError:
    raise app.UsageError(
        f'--points holds {text!r}: give users:clients_per_round, e.g. '
        '1000000:10000.') from None
  if not 0 < clients <= users:
    raise app.UsageError(f'--points holds {text!r}: clients per round must '
                         'be from 1 to the users.')
  return users, clients


def _run(users: int, clients: int) -> str:
  """Trains one point (or finds it trained); returns its directory."""
  root_dir = os.path.join(_ROOT_DIR.value,
                          f'users{users}_clients{clients}_{_STORE.value}')
  if os.path.exists(os.path.join(root_dir, 'summary.json')):
    return root_dir
  command = [
      sys.executable, '-m', 'tff_fedrec.programs.train', '--method=pfedrec',
      '--dataset=synthetic', f'--synthetic_users={users}',
      f'--synthetic_items={_ITEMS.value}', f'--clients_per_round={clients}',
      f'--rounds={_ROUNDS.value}', f'--eval_every={_ROUNDS.value}',
      f'--client_store={_STORE.value}', f'--root_dir={root_dir}',
      *_EXTRA.value,
  ]
  print('$ ' + ' '.join(command), flush=True)
  subprocess.run(command, check=True)
  return root_dir


def _size(path: str) -> int:
  if os.path.isfile(path):
    return os.path.getsize(path)
  return sum(os.path.getsize(os.path.join(folder, name))
             for folder, _, names in os.walk(path) for name in names)


def figures(root_dir: str) -> dict:
  """One run's figures from its directory."""
  with open(os.path.join(root_dir, 'summary.json')) as file:
    summary = json.load(file)
  with open(os.path.join(root_dir, 'metrics.csv')) as file:
    rows = list(csv.DictReader(file))
  checkpoints = os.path.join(root_dir, 'checkpoints')
  database = os.path.join(checkpoints, 'client_states.sqlite')
  versions = sorted(
      (name for name in os.listdir(checkpoints)
       if name.startswith('program_state_')),
      key=lambda name: int(name.rsplit('_', 1)[1]))
  return {
      'users': summary['num_users'],
      'clients': summary['config']['clients_per_round'],
      'train_seconds': statistics.median(
          float(row['train_seconds']) for row in rows[1:]),
      'peak_mb': summary['peak_rss_mb'],
      'state_kib': summary['client_state_bytes_per_user'] / 1024,
      'program_state_mb': _size(os.path.join(checkpoints, versions[-1])) / 1e6,
      'database_mb': (_size(database) + _size(database + '-wal')) / 1e6
                     if os.path.exists(database) else 0.0,
      'test_hr@10': summary['test']['hr@10'],
  }


def _plot(rows: list[dict], path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  clients = rows[0]['clients']
  by_users = sorted((r for r in rows if r['clients'] == clients),
                    key=lambda r: r['users'])
  most = max(r['users'] for r in rows)
  by_clients = sorted((r for r in rows if r['users'] == most),
                      key=lambda r: r['clients'])
  figure, axes = pyplot.subplots(1, 2, figsize=(10, 4))
  for axis, series, key, label in (
      (axes[0], by_users, 'users', f'users ({clients:,} clients a round)'),
      (axes[1], by_clients, 'clients', f'clients a round ({most:,} users)')):
    x = [r[key] for r in series]
    axis.plot(x, [r['train_seconds'] for r in series], 'o-', color='C0')
    axis.set_xscale('log')
    axis.set_xlabel(label)
    axis.set_ylabel('seconds a round (training)', color='C0')
    twin = axis.twinx()
    twin.plot(x, [r['peak_mb'] / 1024 for r in series], 's--', color='C1')
    twin.set_ylabel('peak memory, GB (program + worker)', color='C1')
    twin.axhline(8, color='C1', linewidth=0.5)
    axis.set_ylim(bottom=0)
    twin.set_ylim(0, 9)
  figure.suptitle('PFedRec on synthetic data, client state on disk')
  figure.tight_layout()
  figure.savefig(path, dpi=100)


def main(argv):
  del argv
  points = [_point(text) for text in _POINTS.value]
  rows = [figures(_run(users, clients)) for users, clients in points]
  print(f'{"users":>9} {"clients":>8} {"s/round":>8} {"peak MB":>8} '
        f'{"state KiB":>9} {"ckpt MB":>8} {"db MB":>8} {"HR@10":>7}')
  for row in rows:
    print(f'{row["users"]:>9,} {row["clients"]:>8,} '
          f'{row["train_seconds"]:>8.2f} {row["peak_mb"]:>8.0f} '
          f'{row["state_kib"]:>9.2f} {row["program_state_mb"]:>8.2f} '
          f'{row["database_mb"]:>8.1f} {row["test_hr@10"]:>7.4f}')
  if _PLOT.value:
    _plot(rows, _PLOT.value)
    print(f'plot: {_PLOT.value}')


if __name__ == '__main__':
  app.run(main)
