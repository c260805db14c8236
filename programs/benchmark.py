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
import subprocess
import sys

from absl import app
from absl import flags

_METHODS = flags.DEFINE_list(
    'methods', ['pfedrec', 'fedmf', 'fedncf'], 'Methods to run.'
)
_DATASET = flags.DEFINE_string('dataset', 'ml-100k', 'Data set.')
_ROUNDS = flags.DEFINE_integer('rounds', 100, 'Rounds per method.')
_ROOT_DIR = flags.DEFINE_string(
    'root_dir', 'runs/benchmark', 'One sub-directory per method goes here.'
)
_EXTRA = flags.DEFINE_list(
    'extra_flags', [], 'More flags for every run, e.g. --extra_flags=--seed=1.'
)

_PRESET_DIR = os.path.join(os.path.dirname(__file__), 'presets')


def _method_flags(method: str) -> list[str]:
  """The preset of `method` on the data set if there is one, else defaults."""
  preset = os.path.join(_PRESET_DIR, f'{method}_{_DATASET.value.replace("-", "")}.flags')
  if os.path.exists(preset):
    return [f'--flagfile={preset}']
  return [f'--method={method}', f'--dataset={_DATASET.value}']


def _run(method: str) -> dict:
  root_dir = os.path.join(_ROOT_DIR.value, method)
  command = [
      sys.executable, '-m', 'tff_fedrec.programs.train',
      *_method_flags(method), f'--method={method}',
      f'--dataset={_DATASET.value}', f'--rounds={_ROUNDS.value}',
      f'--root_dir={root_dir}', *_EXTRA.value,
  ]
  print('$', ' '.join(command), flush=True)
  subprocess.run(command, check=True)
  with open(os.path.join(root_dir, 'summary.json')) as f:
    return json.load(f)


def _print_tiered(summaries) -> None:
  print(f'\n{_DATASET.value}: test metrics after the last round')
  print(
      f'{"method":<20} {"rounds":>6} {"Recall@20":>9} {"NDCG@20":>8} '
      f'{"NDCG@20 s / m / l":>26} {"s/round":>8} {"peak MB":>8} '
      f'{"KiB up/client s / m / l":>26}'
  )
  for s in summaries:
    tiers = s['test']['per_tier']
    per_tier = ' / '.join(
        f'{tiers[t]["ndcg@20"]:.5f}' for t in ('small', 'medium', 'large')
    )
    sent = ' / '.join(
        f'{s["bytes_per_client"][t]["upload"] / 1024:.1f}'
        for t in ('small', 'medium', 'large')
    )
    print(
        f'{s["method"]:<20} {s["rounds_completed"]:>6} '
        f'{s["test"]["recall@20"]:>9.5f} {s["test"]["ndcg@20"]:>8.5f} '
        f'{per_tier:>26} {s["seconds_per_round"]:>8.2f} '
        f'{s["peak_rss_mb"]:>8.0f} {sent:>26}'
    )


def main(argv):
  del argv
  summaries = [_run(method) for method in _METHODS.value]
  if all('per_tier' in s['test'] for s in summaries):
    _print_tiered(summaries)
    return
  header = (
      f'{"method":<10} {"rounds":>6} {"best":>5} {"HR@10":>7} {"NDCG@10":>8} '
      f'{"s/round":>8} {"peak MB":>8} {"up MB/rd":>9} {"down MB/rd":>10}'
  )
  print(f'\n{_DATASET.value}: test metrics at the best validation round')
  print(header)
  for s in summaries:
    print(
        f'{s["method"]:<10} {s["rounds_completed"]:>6} {s["best_round"]:>5} '
        f'{s["test"]["hr@10"]:>7.4f} {s["test"]["ndcg@10"]:>8.4f} '
        f'{s["seconds_per_round"]:>8.2f} {s["peak_rss_mb"]:>8.0f} '
        f'{s["bytes_per_round"]["upload"] / 1e6:>9.1f} '
        f'{s["bytes_per_round"]["download"] / 1e6:>10.1f}'
    )


if __name__ == '__main__':
  app.run(main)
