r"""The fairness grid of any method: MDAC of tier-aware optimisations
against paired baselines, over device mappings and seeds (RF², Maeng et
al., RecSys '22, Sec. 6; for rf2 also its Takeaways 2, 5 and 6).

For every (model, mapping, seed) it trains the run without optimisation
first, then each optimisation with `--paired_baseline` pointing at it
(same seed, same tiers, same initial model and client order), all through
the training program; a run whose summary.json exists is not run again
and an interrupted run resumes from its checkpoint, so the grid resumes.
It prints a progress line with an ETA after every run. Then it prints,
per mapping and optimisation, the protocol's metric (AUC, HR@10 or
Recall@20), the MDAC and each tier's relative change (mean +- standard
error over seeds) and, for rf2, the three takeaways held / not held, and
writes the figures of each model to --out_dir/figures: MDAC by
optimisation and mapping (the paper's Fig. 6-7) and each tier's relative
change (Fig. 8), with standard-error bars over seeds (PNG).

  .venv/bin/python benchmarks/fairness_grid.py --out_dir=/tmp/rf2_grid

runs RF²'s whole grid for seed 0: DLRM and DIN, round-robin and the five
alphas, the paper's 14 optimisations and the baseline (180 runs, 3 epochs
each); a part of it:

  .venv/bin/python benchmarks/fairness_grid.py --out_dir=/tmp/rf2_grid \
      --models=dlrm --mappings=round_robin,dirichlet:0.005 \
      --optimizations='exclude_low quant:4,8,32 quants:4,8,32' \
      --seeds=0,1,2 --epochs=3

  .venv/bin/python benchmarks/fairness_grid.py --method=pfedrec \
      --run_flags='--flagfile=programs/presets/pfedrec_ml100k.flags' \
      --out_dir=/tmp/fair --mappings=dirichlet:0.005 \
      --optimizations='exclude_low quant:4,8,32' --epochs=0

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
import time

from absl import app
from absl import flags

from tff_fedrec import tier_optimizations

_OUT_DIR = flags.DEFINE_string('out_dir', None, 'Where the runs go.')
_METHOD = flags.DEFINE_string('method', 'rf2', 'The --method of every run.')
_RUN_FLAGS = flags.DEFINE_string(
    'run_flags', '',
    'More flags of every run, space-separated (e.g. a preset\'s '
    '--flagfile; given before the grid\'s own, which win).')
_DATASET = flags.DEFINE_string(
    'dataset', None, 'Data set (default: the run flags\', else ml-1m).')
_MODELS = flags.DEFINE_list(
    'models', ['dlrm', 'din'],
    'rf2: --model values (dlrm, din), each a grid of its own.')
_MAPPINGS = flags.DEFINE_list(
    'mappings', ['round_robin', *(f'dirichlet:{alpha}' for alpha in
                                  ('5000', '5', '0.5', '0.05', '0.005'))],
    '--device_tiers values (default: RF²\'s six, Sec. 5.3).')
_OPTIMIZATIONS = flags.DEFINE_spaceseplist(
    'optimizations', list(tier_optimizations.PAPER_CONFIGURATIONS),
    '--tier_optimization values, space-separated (they hold commas; '
    'default: RF²\'s 14).')
_SEEDS = flags.DEFINE_list('seeds', ['0'], 'Seeds.')
_EPOCHS = flags.DEFINE_integer(
    'epochs', 3, 'Global epochs of every run (0: the run flags\' rounds).')
_ROUNDS = flags.DEFINE_integer(
    'rounds', None,
    'Rounds of every run instead of --epochs (the same server steps for '
    'Exclude Lo and Overselect as for their baseline).')
_SHARD = flags.DEFINE_string('shard', '0/1', 'i/n: this process\'s part.')
_TABLE_ONLY = flags.DEFINE_bool('table_only', False, 'Only print.')
_TIERS = ('low', 'mid', 'high')
_METRIC_NAMES = {'auc': 'AUC', 'hr@10': 'HR@10', 'recall@20': 'Recall@20'}


def _models():
  return _MODELS.value if _METHOD.value == 'rf2' else [_METHOD.value]


def _run_dir(model, mapping, optimization, seed):
  return os.path.join(_OUT_DIR.value, model, mapping.replace(':', '_'),
                      optimization.replace(':', '_').replace(',', '-'),
                      f'seed{seed}')


def _summary(path):
  try:
    with open(os.path.join(path, 'summary.json')) as file:
      return json.load(file)
  except OSError:
    return None


def _train(model, mapping, optimization, seed) -> bool:
  """Trains one run unless it is finished; whether it trained."""
  root = _run_dir(model, mapping, optimization, seed)
  if _summary(root) is not None:
    return False
  command = [
      sys.executable, '-m', 'tff_fedrec.programs.train',
      *_RUN_FLAGS.value.split(), f'--method={_METHOD.value}',
      f'--device_tiers={mapping}',
      f'--tier_optimization={optimization}', f'--seed={seed}',
      f'--root_dir={root}']
  if _DATASET.value or not _RUN_FLAGS.value:
    command.append(f'--dataset={_DATASET.value or "ml-1m"}')
  if _METHOD.value == 'rf2':
    command.append(f'--model={model}')
  if _ROUNDS.value is not None:
    command.append(f'--rounds={_ROUNDS.value}')
  elif _EPOCHS.value:
    command.append(f'--epochs={_EPOCHS.value}')
  if optimization != 'none':
    command.append(
        f'--paired_baseline={_run_dir(model, mapping, "none", seed)}')
  print(' '.join(command[1:]), flush=True)
  result = subprocess.run(command, capture_output=True, text=True)
  if result.returncode:
    raise RuntimeError(f'{root} failed:\n{result.stderr[-3000:]}')
  print('\n'.join(line for line in result.stdout.splitlines()
                  if 'test ' in line or 'seconds per round' in line
                  or 'MDAC' in line), flush=True)
  return True


def _mean_error(values):
  values = list(values)
  error = (statistics.stdev(values) / len(values)**0.5 if len(values) > 1
           else float('nan'))
  return statistics.fmean(values), error


def _cell(values):
  mean, error = _mean_error(values)
  return f'{100 * mean:7.3f} +- {100 * error:.3f}'


def _collect(model):
  """{(mapping, optimization): [summary of each seed]}."""
  runs = collections.defaultdict(list)
  for mapping in _MAPPINGS.value:
    for optimization in ['none', *_OPTIMIZATIONS.value]:
      for seed in _SEEDS.value:
        summary = _summary(_run_dir(model, mapping, optimization, seed))
        if summary is not None:
          runs[(mapping, optimization)].append(summary)
  return runs


def _metric(runs) -> str:
  """The protocol's per-tier metric the MDAC compares (the runs'; AUC
  in the rf2 runs made before other methods had one)."""
  for summaries in runs.values():
    for summary in summaries:
      if 'mdac' in summary:
        return summary['mdac'].get('metric', 'auc')
  return 'auc'


def _table(model, runs):
  length = (f'{_ROUNDS.value} rounds' if _ROUNDS.value is not None
            else f'{_EPOCHS.value} epochs' if _EPOCHS.value
            else 'the run flags\' rounds')
  metric = _metric(runs)
  print(f'\n{_DATASET.value or ""} {model}, {length}; test {metric} and '
        'relative changes in %, mean +- s.e. over seeds')
  print(f'{"mapping":16s} {"optimization":22s} {"n":>2s} '
        f'{metric:>16s} {"MDAC":>16s} ' + ' '.join(
            f'{"d" + t:>16s}' for t in _TIERS) + f' {"d total":>16s}')
  for (mapping, optimization), summaries in runs.items():
    values = [s['test'][metric] for s in summaries]
    line = (f'{mapping:16s} {optimization:22s} {len(summaries):2d} '
            f'{_cell(values):>16s} ')
    if optimization == 'none':
      print(line)
      continue
    base = runs[(mapping, 'none')]
    total = [(s['test'][metric] - b['test'][metric]) / b['test'][metric]
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


def _run_all():
  """Trains this shard's runs, with a progress line and ETA after each."""
  index, count = map(int, _SHARD.value.split('/'))
  groups = [(model, mapping, seed) for model in _models()
            for mapping in _MAPPINGS.value for seed in _SEEDS.value]
  runs = [(model, mapping, optimization, seed)
          for model, mapping, seed in groups[index::count]
          for optimization in ['none', *_OPTIMIZATIONS.value]]
  seconds = []
  for done, run in enumerate(runs, 1):
    started = time.monotonic()
    if _train(*run):
      seconds.append(time.monotonic() - started)
    left = len(runs) - done
    eta = statistics.fmean(seconds) * left if seconds else 0.0
    print(f'[grid] {done}/{len(runs)} runs done ({len(seconds)} trained '
          f'now, {statistics.fmean(seconds) if seconds else 0:.0f} s each); '
          f'ETA {eta / 3600:.2f} h', flush=True)


def _title(model) -> str:
  return (f'{_METHOD.value} {model}' if _METHOD.value == 'rf2'
          else _METHOD.value)


def _figures(model, runs) -> list[str]:
  """Writes Fig. 6-7 (MDAC) and Fig. 8 (per-tier change) of `model`'s
  runs; returns their paths."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top

  metric = _METRIC_NAMES.get(_metric(runs), _metric(runs))
  mappings = [m for m in _MAPPINGS.value
              if any((m, o) in runs for o in _OPTIMIZATIONS.value)]
  optimizations = [o for o in _OPTIMIZATIONS.value
                   if any((m, o) in runs for m in mappings)]
  if not mappings or not optimizations:
    return []
  folder = os.path.join(_OUT_DIR.value, 'figures')
  os.makedirs(folder, exist_ok=True)
  paths = []
  width = 0.8 / len(mappings)
  figure, axes = pyplot.subplots(
      figsize=(max(6.0, 1.1 * len(optimizations) + 2), 4.0))
  for index, mapping in enumerate(mappings):
    cells = [_mean_error(s['mdac']['mdac'] for s in runs[(mapping, o)])
             if (mapping, o) in runs else (float('nan'), 0.0)
             for o in optimizations]
    axes.bar([i + (index - (len(mappings) - 1) / 2) * width
              for i in range(len(optimizations))],
             [100 * mean for mean, _ in cells], width,
             yerr=[100 * (error if error == error else 0.0)
                   for _, error in cells],
             capsize=3, label=mapping)
  axes.set_xticks(range(len(optimizations)))
  axes.set_xticklabels(optimizations, rotation=30, ha='right', fontsize=8)
  axes.set_ylabel(f'MDAC of test {metric} (%)')
  axes.set_title(f'{_title(model)}: MDAC by optimisation and '
                 'mapping (mean +- s.e. over seeds)', fontsize=9)
  axes.legend(fontsize=8)
  figure.tight_layout()
  paths.append(os.path.join(folder, f'{model}_mdac.png'))
  figure.savefig(paths[-1], dpi=120)
  pyplot.close(figure)

  figure, panels = pyplot.subplots(
      1, len(mappings), squeeze=False,
      figsize=(max(6.0, 4.5 * len(mappings)), 4.0), sharey=True)
  width = 0.8 / len(_TIERS)
  for panel, mapping in zip(panels[0], mappings):
    for index, tier in enumerate(_TIERS):
      cells = [_mean_error(s['mdac']['relative_change'][tier]
                           for s in runs[(mapping, o)])
               if (mapping, o) in runs else (float('nan'), 0.0)
               for o in optimizations]
      panel.bar([i + (index - 1) * width for i in range(len(optimizations))],
                [100 * mean for mean, _ in cells], width,
                yerr=[100 * (error if error == error else 0.0)
                      for _, error in cells],
                capsize=2, label=tier)
    panel.axhline(0.0, color='black', linewidth=0.6)
    panel.set_xticks(range(len(optimizations)))
    panel.set_xticklabels(optimizations, rotation=30, ha='right', fontsize=8)
    panel.set_title(mapping, fontsize=9)
  panels[0][0].set_ylabel(f'relative change of test {metric} (%)')
  panels[0][0].legend(fontsize=8)
  figure.suptitle(f'{_title(model)}: each tier\'s change against '
                  'the paired baseline (mean +- s.e.)', fontsize=9)
  figure.tight_layout()
  paths.append(os.path.join(folder, f'{model}_per_tier.png'))
  figure.savefig(paths[-1], dpi=120)
  pyplot.close(figure)
  return paths


def main(argv):
  del argv
  if not _TABLE_ONLY.value:
    _run_all()
  for model in _models():
    runs = _collect(model)
    _table(model, runs)
    if _METHOD.value == 'rf2':
      _takeaways(runs)
    for path in _figures(model, runs):
      print(f'figure: {path}')


if __name__ == '__main__':
  flags.mark_flag_as_required('out_dir')
  app.run(main)
