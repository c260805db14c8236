r"""RF²'s fairness grid: MDAC of tier-aware optimisations against paired
baselines, over device mappings and seeds (Maeng et al., RecSys '22,
Sec. 6, Takeaways 2, 5 and 6).

For every (mapping, seed) it trains the run without optimisation first,
then each optimisation with `--paired_baseline` pointing at it (same seed,
same tiers, same initial model and client order), all through the
training program; a run whose summary.json exists is not run again, so
the grid resumes. Then it prints, per mapping and optimisation, the MDAC
and each tier's relative AUC change (mean +- standard error over seeds)
and the three takeaways held / not held.

  .venv/bin/python benchmarks/rf2_grid.py --out_dir=/tmp/rf2_grid \
      --mappings=round_robin,dirichlet:0.005 \
      --optimizations='exclude_low quant:4,8,32 quants:4,8,32' \
      --seeds=0,1,2 --epochs=3

`--shard=i/n` runs the i-th of n disjoint parts ((mapping, seed) pairs),
so two processes can share the machine; `--table_only` prints from the
runs there are.
"""

import collections
import json
import os
import statistics
import subprocess
import sys

from absl import app
from absl import flags

_OUT_DIR = flags.DEFINE_string('out_dir', None, 'Where the runs go.')
_DATASET = flags.DEFINE_string('dataset', 'ml-1m', 'Data set.')
_MODEL = flags.DEFINE_enum('model', 'dlrm', ['dlrm', 'din'], 'Model.')
_MAPPINGS = flags.DEFINE_list('mappings', ['round_robin', 'dirichlet:0.005'],
                              '--device_tiers values.')
_OPTIMIZATIONS = flags.DEFINE_spaceseplist(
    'optimizations', ['exclude_low'],
    '--tier_optimization values, space-separated (they hold commas).')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds.')
_EPOCHS = flags.DEFINE_integer('epochs', 3, 'Global epochs of every run.')
_ROUNDS = flags.DEFINE_integer(
    'rounds', None,
    'Rounds of every run instead of --epochs (the same server steps for '
    'Exclude Lo and Overselect as for their baseline).')
_SHARD = flags.DEFINE_string('shard', '0/1', 'i/n: this process\'s part.')
_TABLE_ONLY = flags.DEFINE_bool('table_only', False, 'Only print.')
_TIERS = ('low', 'mid', 'high')


def _run_dir(mapping, optimization, seed):
  return os.path.join(_OUT_DIR.value, _MODEL.value, mapping.replace(':', '_'),
                      optimization.replace(':', '_').replace(',', '-'),
                      f'seed{seed}')


def _summary(path):
  try:
    with open(os.path.join(path, 'summary.json')) as file:
      return json.load(file)
  except OSError:
    return None


def _train(mapping, optimization, seed):
  root = _run_dir(mapping, optimization, seed)
  if _summary(root) is not None:
    return
  command = [
      sys.executable, '-m', 'tff_fedrec.programs.train', '--method=rf2',
      f'--dataset={_DATASET.value}', f'--model={_MODEL.value}',
      f'--device_tiers={mapping}', f'--tier_optimization={optimization}',
      f'--seed={seed}', f'--root_dir={root}',
      (f'--epochs={_EPOCHS.value}' if _ROUNDS.value is None
       else f'--rounds={_ROUNDS.value}'),
      '--checkpoint_every=1000000']
  if optimization != 'none':
    command.append(f'--paired_baseline={_run_dir(mapping, "none", seed)}')
  print(' '.join(command[1:]), flush=True)
  result = subprocess.run(command, capture_output=True, text=True)
  if result.returncode:
    raise RuntimeError(f'{root} failed:\n{result.stderr[-3000:]}')
  print('\n'.join(line for line in result.stdout.splitlines()
                  if 'test AUC' in line or 'seconds per round' in line),
        flush=True)


def _mean_error(values):
  values = list(values)
  error = (statistics.stdev(values) / len(values)**0.5 if len(values) > 1
           else float('nan'))
  return statistics.fmean(values), error


def _cell(values):
  mean, error = _mean_error(values)
  return f'{100 * mean:7.3f} +- {100 * error:.3f}'


def _collect():
  """{(mapping, optimization): [summary of each seed]}."""
  runs = collections.defaultdict(list)
  for mapping in _MAPPINGS.value:
    for optimization in ['none', *_OPTIMIZATIONS.value]:
      for seed in _SEEDS.value:
        summary = _summary(_run_dir(mapping, optimization, seed))
        if summary is not None:
          runs[(mapping, optimization)].append(summary)
  return runs


def _table(runs):
  length = (f'{_EPOCHS.value} epochs' if _ROUNDS.value is None
            else f'{_ROUNDS.value} rounds')
  print(f'\n{_DATASET.value} {_MODEL.value}, {length}; '
        '% mean +- s.e. over seeds')
  print(f'{"mapping":16s} {"optimization":22s} {"n":>2s} '
        f'{"AUC":>16s} {"MDAC":>16s} ' + ' '.join(
            f'{"d" + t:>16s}' for t in _TIERS) + f' {"d total":>16s}')
  for (mapping, optimization), summaries in runs.items():
    aucs = [s['test']['auc'] for s in summaries]
    line = (f'{mapping:16s} {optimization:22s} {len(summaries):2d} '
            f'{_cell(aucs):>16s} ')
    if optimization == 'none':
      print(line)
      continue
    base = runs[(mapping, 'none')]
    total = [(s['test']['auc'] - b['test']['auc']) / b['test']['auc']
             for s, b in zip(summaries, base)]
    line += f'{_cell(s["mdac"]["mdac"] for s in summaries):>16s} '
    line += ' '.join(
        f'{_cell(s["mdac"]["relative_change"][t] for s in summaries):>16s}'
        for t in _TIERS)
    print(line + f' {_cell(total):>16s}')


def _mean_mdac(runs, mapping, optimization):
  summaries = runs.get((mapping, optimization))
  if not summaries:
    return None
  return statistics.fmean(s['mdac']['mdac'] for s in summaries)


def _mean_change(runs, mapping, optimization, tier):
  return statistics.fmean(s['mdac']['relative_change'][tier]
                          for s in runs[(mapping, optimization)])


def _takeaways(runs):
  print('\nTakeaways (means over seeds):')
  lows = [m for m in _MAPPINGS.value if m == 'round_robin']
  highs = [m for m in _MAPPINGS.value if m == 'dirichlet:0.005']
  if lows and highs and ('exclude_low' in _OPTIMIZATIONS.value):
    low = _mean_mdac(runs, lows[0], 'exclude_low')
    high = _mean_mdac(runs, highs[0], 'exclude_low')
    if low is not None and high is not None:
      worst = min(_TIERS, key=lambda t: _mean_change(
          runs, highs[0], 'exclude_low', t))
      held = high >= 3 * low and worst == 'low'
      print(f'  2: Exclude Lo MDAC at alpha 0.005 {100 * high:.3f}% vs '
            f'round-robin {100 * low:.3f}% ({high / low:.1f}x), tier losing '
            f'most: {worst}: {"held" if held else "not held"}')
  for mapping in _MAPPINGS.value:
    if mapping == 'round_robin' or float(mapping.split(':')[1]) > 0.5:
      continue
    gaps = []
    for ratio in ('8,16,32', '4,8,32', '2,4,32'):
      quant = _mean_mdac(runs, mapping, f'quant:{ratio}')
      quant_s = _mean_mdac(runs, mapping, f'quants:{ratio}')
      if quant is not None and quant_s is not None:
        gaps.append((ratio, quant, quant_s))
    if len(gaps) == 3:
      below = all(qs < q for _, q, qs in gaps)
      growing = all(b[1] - b[2] > a[1] - a[2] for a, b in zip(gaps, gaps[1:]))
      print(f'  5 ({mapping}): ' + '; '.join(
          f'{r}: Quant {100 * q:.3f}% QuantS {100 * qs:.3f}%'
          for r, q, qs in gaps) + f': QuantS below Quant '
            f'{"held" if below else "not held"}, gap growing with the ratio '
            f'{"held" if growing else "not held"}')
    for optimization in _OPTIMIZATIONS.value:
      if (mapping, optimization) not in runs:
        continue
      changes = {t: _mean_change(runs, mapping, optimization, t)
                 for t in _TIERS}
      kind = optimization.split(':')[0]
      if kind == 'quant':
        held = max(changes['mid'], changes['high']) < changes['low']
        claim = 'mid and high lose more than low'
      elif kind in ('prune', 'channel', 'exclude_low'):
        held = min(changes, key=changes.get) == 'low'
        claim = 'low loses most'
      else:
        continue
      print(f'  6 ({mapping}, {optimization}): ' + ', '.join(
          f'{t} {100 * c:+.3f}%' for t, c in changes.items())
            + f': {claim} {"held" if held else "not held"}')


def main(argv):
  del argv
  if not _TABLE_ONLY.value:
    index, count = map(int, _SHARD.value.split('/'))
    pairs = [(m, s) for m in _MAPPINGS.value for s in _SEEDS.value]
    for mapping, seed in pairs[index::count]:
      for optimization in ['none', *_OPTIMIZATIONS.value]:
        _train(mapping, optimization, seed)
  runs = _collect()
  _table(runs)
  _takeaways(runs)


if __name__ == '__main__':
  flags.mark_flag_as_required('out_dir')
  app.run(main)
