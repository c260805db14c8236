"""P, APFR-GKD's degree of data heterogeneity (Eq. 4-5), of every data set
a user can load here, and the mode its adapter chooses.

  .venv/bin/python benchmarks/heterogeneity.py \
      [--datasets=synthetic,ml-100k,ml-1m] [--data_paths=FILE,...]

Prints one line per data set: users, items, P (with `heterogeneity`'s
features, k = 10, m = 32), the adapter's mode at the default threshold, and
the seconds P took. P over the leave-one-out training items, as a run
computes it.
"""

import time

from absl import app
from absl import flags

from tff_fedrec.algorithms.apfr_gkd import heterogeneity
from tff_fedrec.tasks import datasets

_DATASETS = flags.DEFINE_list(
    'datasets', ['synthetic', 'ml-100k', 'ml-1m'], 'Data sets to measure.')
_DATA_PATHS = flags.DEFINE_list(
    'data_paths', [], 'Local user,item,rating,timestamp files to measure.')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'k-means seeds.')


def main(argv):
  del argv
  configs = [datasets.DataConfig(dataset=name) for name in _DATASETS.value]
  configs += [datasets.DataConfig(dataset='ml-100k', data_path=path)
              for path in _DATA_PATHS.value]
  print(f'{"data set":<28} {"users":>6} {"items":>6}  P per seed '
        f'{"(mode at " + str(heterogeneity.DEFAULT_THRESHOLD) + ")":<16} s')
  for config in configs:
    data = datasets.load_leave_one_out(config)
    values, seconds = [], []
    for seed in _SEEDS.value:
      start = time.perf_counter()
      values.append(heterogeneity.heterogeneity(
          data.train_offsets, data.train_items, data.num_items,
          seed=int(seed)))
      seconds.append(time.perf_counter() - start)
    modes = {heterogeneity.personalization_mode(
        p, heterogeneity.DEFAULT_THRESHOLD) for p in values}
    print(f'{config.data_path or config.dataset:<28} {data.num_users:>6} '
          f'{data.num_items:>6}  '
          f'{" ".join(f"{p:.4f}" for p in values)}  {"/".join(sorted(modes))}'
          f'  {max(seconds):.1f}')


if __name__ == '__main__':
  app.run(main)
