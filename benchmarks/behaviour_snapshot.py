"""Every registry entry's 2-round synthetic run, to show that a refactor
changed no figure.

  .venv/bin/python benchmarks/behaviour_snapshot.py run OUT [--only=NAME,...] \
      [--extra_flags=--client_store=disk]
  .venv/bin/python benchmarks/behaviour_snapshot.py compare BEFORE AFTER

`run` trains each configuration below for 2 rounds on synthetic data with
`python -m tff_fedrec.programs.train` (two at a time, one per core) and
keeps OUT/<configuration>/summary.json and metrics.csv. `compare` prints one
markdown row per configuration: its test metrics and which of the compared
fields differ (`_COMPARED`: test, validation, best round, final-round test,
test history, the per-round training loss and bytes, the bytes summary,
client-state bytes per user and the method's own figures), and which
fields only AFTER has (additions, e.g. a new per-tier report). Timings and
memory are not compared.

Every configuration runs with --users_per_tff_client=3, so groups of
several users (and their padding) are exercised.
"""

import concurrent.futures
import csv
import json
import math
import os
import subprocess
import sys

from absl import app
from absl import flags

from tff_fedrec.algorithms import registry

_ONLY = flags.DEFINE_list('only', [], 'Configurations to run (all if empty).')
_EXTRA = flags.DEFINE_list(
    'extra_flags', [], 'More flags for every run (comma-separated), e.g. '
    '--extra_flags=--client_store=disk to compare the stores.')

_ITEM_RANKING = ['--dataset=synthetic', '--synthetic_users=40',
                 '--synthetic_items=300', '--num_eval_negatives=20',
                 '--users_per_tff_client=3']
_LOCAL_SGD = [*_ITEM_RANKING, '--embedding_dim=8', '--item_learning_rate=50']
_TIERED = ['--dataset=synthetic', '--synthetic_users=60',
           '--synthetic_items=200', '--clients_per_round=30',
           '--tier_widths=2,4,8', '--users_per_tff_client=3']
_FEDRAS = [*_LOCAL_SGD, '--client_fraction=0.5', '--compression_rate=0.75']
_CLICK_THROUGH = ['--dataset=synthetic', '--synthetic_users=60',
                  '--clients_per_round=20', '--users_per_tff_client=4',
                  '--device_tiers=dirichlet:0.05']


def _defaults(name: str) -> list[str]:
  entry = registry.get(name)
  if entry.protocol == registry.RANDOM_SPLIT:
    return _TIERED
  if entry.protocol == registry.CLICK_THROUGH:
    return _CLICK_THROUGH
  if name == 'fedrap':
    return [*_ITEM_RANKING, '--embedding_dim=8', '--local_epochs=2',
            '--fedrap_batch_size=32', '--fedrap_item_learning_rate=20']
  if name.startswith('apfr_gkd'):
    return [*_LOCAL_SGD, '--local_epochs=2']
  if entry.exchange is not None:
    return _FEDRAS
  return _LOCAL_SGD


CONFIGURATIONS = {
    **{name: [f'--method={name}', *_defaults(name)]
       for name in registry.METHODS},
    'pfedrec_ldp_mlp': ['--method=pfedrec', *_LOCAL_SGD, '--hidden_units=8',
                        '--ldp_noise_scale=0.1'],
    'pfedrec_fraction': ['--method=pfedrec', *_LOCAL_SGD,
                         '--client_fraction=0.5',
                         '--negative_pool=outside_training'],
    'pfedrec_fedras_exchange': ['--method=pfedrec', *_FEDRAS,
                                '--exchange=fedras'],
    'fedmf_dual': ['--method=fedmf', *_LOCAL_SGD, '--dual_personalization'],
    'fedncf_dual': ['--method=fedncf', *_LOCAL_SGD, '--dual_personalization'],
    'fedrecon_dual': ['--method=fedrecon', *_LOCAL_SGD,
                      '--dual_personalization'],
    'rf2_din_quants': ['--method=rf2', *_CLICK_THROUGH, '--model=din',
                       '--tier_optimization=quants:2,4,32'],
    'rf2_channel': ['--method=rf2', *_CLICK_THROUGH,
                    '--tier_optimization=channel:0.25,0.5,1'],
    'fedras_ncf_range': ['--method=fedras', *_FEDRAS, '--model=ncf',
                         '--compression_rate_range=0.7,0.8', '--alpha=0.5'],
    'apfr_gkd_own_model': ['--method=apfr_gkd', *_LOCAL_SGD,
                           '--local_epochs=2', '--client_start=own_model',
                           '--user_learning_rate=2'],
    'apfr_gkd_dual_own_model': ['--method=apfr_gkd_dual', *_LOCAL_SGD,
                                '--local_epochs=2',
                                '--client_start=own_model'],
    'apfr_gkd_listwise_latest': ['--method=apfr_gkd_dual', *_LOCAL_SGD,
                                 '--local_epochs=2', '--distillation=listwise',
                                 '--student_start=latest_aggregate'],
    'hetefedrec_lightgcn_local': [
        '--method=hetefedrec', *_TIERED, '--model=lightgcn',
        '--update_rule=local_adam', '--local_epochs=2',
        '--local_validation_fraction=0.1', '--change_aggregation=mean',
        '--local_batch_size=16', '--training_negatives=once'],
    'hetefedrec_fedavg_useradam': [
        '--method=hetefedrec', *_TIERED, '--update_rule=local_adam',
        '--change_aggregation=fedavg'],
    'clustered_user_adam': ['--method=clustered', *_TIERED,
                            '--user_optimizer=adam'],
}

# Summary fields compared (those present); nested dicts whole.
_COMPARED = ('test', 'validation', 'best_round', 'final_round_test',
             'test_history', 'bytes_per_round', 'bytes_per_client',
             'measured_compression_rate', 'client_state_bytes_per_user',
             'downlink', 'heterogeneity', 'personalization',
             'singular_value_variance_large', 'mean_kept_epoch',
             'global_table_sparsity', 'tier_sizes', 'rounds_completed')
# metrics.csv columns that are timings.
_TIMINGS = ('seconds', 'train_seconds')


def _run_one(out: str, name: str) -> str:
  root_dir = os.path.join(out, name)
  result = subprocess.run(
      [sys.executable, '-m', 'tff_fedrec.programs.train',
       *CONFIGURATIONS[name], '--rounds=2', '--seed=0',
       f'--root_dir={root_dir}', *_EXTRA.value],
      capture_output=True, text=True, check=False,
  )
  if result.returncode:
    return f'{name}: FAILED ({result.returncode})\n{result.stderr[-2000:]}'
  return f'{name}: done'


def run(out: str) -> None:
  names = _ONLY.value or list(CONFIGURATIONS)
  unknown = sorted(set(names) - set(CONFIGURATIONS))
  if unknown:
    raise app.UsageError(f'Unknown configurations: {", ".join(unknown)}.')
  os.makedirs(out, exist_ok=True)
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    for line in pool.map(lambda name: _run_one(out, name), names):
      print(line, flush=True)


def _read(root_dir: str):
  with open(os.path.join(root_dir, 'summary.json')) as f:
    summary = json.load(f)
  with open(os.path.join(root_dir, 'metrics.csv')) as f:
    rows = [{k: v for k, v in row.items() if k not in _TIMINGS}
            for row in csv.DictReader(f)]
  return summary, rows


def _same(a, b) -> bool:
  """Whether `b` holds every figure of `a` with the same value (a field
  that only `b` has is an addition, listed apart)."""
  if isinstance(a, float) and isinstance(b, float):
    return a == b or (math.isnan(a) and math.isnan(b))
  if isinstance(a, dict) and isinstance(b, dict):
    return a.keys() <= b.keys() and all(_same(a[k], b[k]) for k in a)
  if isinstance(a, list) and isinstance(b, list):
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
  return a == b


def _added(a, b, prefix='') -> list[str]:
  """The fields of `b` that `a` lacks, dotted."""
  if not (isinstance(a, dict) and isinstance(b, dict)):
    return []
  found = []
  for key in b:
    if key not in a:
      found.append(prefix + key)
    else:
      found += _added(a[key], b[key], f'{prefix}{key}.')
  return found


def _headline(summary: dict) -> str:
  test = summary.get('test', {})
  keys = [k for k in ('hr@10', 'ndcg@10', 'recall@20', 'ndcg@20') if k in test]
  return ' / '.join(f'{test[k]:.6f}' for k in keys)


def compare(before: str, after: str) -> None:
  print('| configuration | test metrics (before) | differences |')
  print('|---|---|---|')
  for name in sorted(set(os.listdir(before)) | set(os.listdir(after))):
    try:
      old, old_rows = _read(os.path.join(before, name))
      new, new_rows = _read(os.path.join(after, name))
    except OSError as error:
      print(f'| {name} | | missing: {error.filename} |')
      continue
    differences = [key for key in _COMPARED
                   if not _same(old.get(key), new.get(key))]
    missing = set(old_rows[0]) - set(new_rows[0])
    if missing:
      differences.append('metrics.csv lacks ' + ', '.join(sorted(missing)))
    for column in set(old_rows[0]) & set(new_rows[0]):
      if any(a[column] != b[column] for a, b in zip(old_rows, new_rows)):
        differences.append(f'metrics.csv {column}')
    added = [field for key in _COMPARED
             for field in _added({key: old.get(key)}, {key: new.get(key)})]
    added += [f'metrics.csv {column}'
              for column in sorted(set(new_rows[0]) - set(old_rows[0]))]
    if added:
      differences.append('added ' + ', '.join(added))
    print(f'| {name} | {_headline(old)} | '
          f'{", ".join(differences) or "equal"} |')


def main(argv):
  if len(argv) == 3 and argv[1] == 'run':
    run(argv[2])
  elif len(argv) == 4 and argv[1] == 'compare':
    compare(argv[2], argv[3])
  else:
    raise app.UsageError('run OUT | compare BEFORE AFTER')


if __name__ == '__main__':
  app.run(main)
