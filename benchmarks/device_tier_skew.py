r"""How skewed RF²'s device tiers make the data: the analogue of its Fig. 4.

RF² (Maeng et al., RecSys '22) Fig. 4 plots, for MovieLens-20M, the ten
most clicked items and how their clicks fall on each device tier under
Dirichlet mappings of decreasing alpha: near thirds when tiers are
unrelated to the data, one tier taking most of an item's clicks at small
alpha. This prints, for MovieLens (a click is a rating of at least
--click_rating, 5 as in the authors' MovieLens pipeline) and each mapping,
the tier sizes and, over the ten most clicked items, the mean share of an
item's clickers that the item's largest tier holds (1/3: no skew; 1: all in
one tier), mean and standard error over seeds. No training.

  .venv/bin/python benchmarks/device_tier_skew.py --dataset=ml-1m \
      --seeds=0,1,2
"""

import numpy as np
from absl import app
from absl import flags

from tff_fedrec import device_tiers
from tff_fedrec.tasks import click_through
from tff_fedrec.tasks import movielens

_DATASET = flags.DEFINE_enum('dataset', 'ml-1m', ['ml-100k', 'ml-1m'],
                             'MovieLens data set (fetched and cached).')
_CLICK_RATING = flags.DEFINE_float(
    'click_rating', 5.0, 'Ratings at least this are clicks.')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Mapping seeds.')
_TOP = flags.DEFINE_integer('top', 10, 'Most clicked items measured.')


def top_item_tier_share(tiers, offsets, items, top):
  """Mean over the `top` most clicked items of the share of the item's
  clickers in its largest tier."""
  user_of_click = np.repeat(np.arange(offsets.size - 1), np.diff(offsets))
  shares = []
  for item in np.argsort(-np.bincount(items), kind='stable')[:top]:
    clickers = np.unique(user_of_click[items == item])
    shares.append(np.bincount(tiers[clickers], minlength=3).max()
                  / clickers.size)
  return float(np.mean(shares))


def mappings(offsets, items, seed):
  """(name, tiers) of round-robin and of every Sec. 5.3 level."""
  yield 'round_robin', device_tiers.round_robin(np.diff(offsets))
  for level, alpha in device_tiers.HETEROGENEITY_LEVELS.items():
    yield (f'dirichlet:{alpha:g} ({level})',
           device_tiers.dirichlet(offsets, items, alpha, seed))


def main(argv):
  del argv
  data = click_through.click_through_split(
      movielens.load_movielens(_DATASET.value),
      movielens.load_movie_genres(_DATASET.value),
      click_rating=_CLICK_RATING.value)
  offsets, items = click_through.clicks_per_user(data)
  print(f'{_DATASET.value}: {offsets.size - 1} users, {items.size} clicks '
        f'(rating >= {_CLICK_RATING.value:g}), '
        f'{int(np.sum(np.diff(offsets) == 0))} users without one')
  results = {}
  for seed in (int(s) for s in _SEEDS.value):
    for name, tiers in mappings(offsets, items, seed):
      results.setdefault(name, []).append((
          np.bincount(tiers, minlength=3),
          top_item_tier_share(tiers, offsets, items, _TOP.value)))
  print(f'{"mapping":26s} {"users low / mid / high (seed 0)":32s} '
        f'top-{_TOP.value} largest-tier share (mean +- s.e.)')
  for name, runs in results.items():
    sizes = ' / '.join(str(int(n)) for n in runs[0][0])
    shares = np.array([share for _, share in runs])
    error = (shares.std(ddof=1) / np.sqrt(shares.size)
             if shares.size > 1 else 0.0)
    print(f'{name:26s} {sizes:32s} {shares.mean():.4f} +- {error:.4f}')


if __name__ == '__main__':
  app.run(main)
