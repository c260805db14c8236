r"""RF²'s click-through task on MovieLens, and the floor a model must beat.

Splits MovieLens as `tasks/click_through.py` does (a rating of 5 is a
click; each user's events in time order, the first 90% train) and prints
the events, click rates and the test AUC and log-loss of each movie's own
training click rate used as the prediction, overall and per device tier of
each mapping asked for (`--device_tiers`: the users' training clicks map
them, as `--device_tiers` does in a run). No training.

  .venv/bin/python benchmarks/click_through_floor.py --dataset=ml-1m \
      --device_tiers=round_robin,dirichlet:0.005
"""

import numpy as np
from absl import app
from absl import flags

from tff_fedrec import device_tiers
from tff_fedrec import metrics
from tff_fedrec.tasks import click_through
from tff_fedrec.tasks import click_through_protocol
from tff_fedrec.tasks import movielens

_DATASET = flags.DEFINE_enum('dataset', 'ml-1m', ['ml-100k', 'ml-1m'],
                             'MovieLens data set (fetched and cached).')
_DEVICE_TIERS = flags.DEFINE_list(
    'device_tiers', ['round_robin', 'dirichlet:0.005'],
    'Mappings whose tiers the floor is reported by.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the mappings.')


def _figures(labels, scores):
  return (f'AUC {metrics.binary_auc(labels, scores):.4f}  '
          f'log-loss {metrics.log_loss(labels, scores):.4f}')


def main(argv):
  del argv
  data = click_through.click_through_split(
      movielens.load_movielens(_DATASET.value),
      movielens.load_movie_genres(_DATASET.value))
  test = ~data.train
  print(f'{_DATASET.value}: {data.num_users} users, {data.num_items} movies, '
        f'{len(data.genre_names)} genres, {data.item.size} events: '
        f'{int(data.train.sum())} train (click rate '
        f'{data.label[data.train].mean():.4f}), {int(test.sum())} test '
        f'(click rate {data.label[test].mean():.4f})')
  scores = click_through.item_click_rate_scores(data)
  print(f'movie click rate as the prediction, test: '
        f'{_figures(data.label[test], scores[test])}')
  split = click_through_protocol.ClickThroughSplit.of(data)
  for value in _DEVICE_TIERS.value:
    policy = device_tiers.policy_from_flag(value)
    # As a run maps them: round-robin by training events, Dirichlet by
    # training clicks.
    tiers = policy.assign(split.train_offsets, split.train_items,
                          _SEED.value, clicks=split.training_clicks())
    for tier, name in enumerate(policy.tier_names):
      rows = test & (tiers[data.user] == tier)
      print(f'  {value:16s} {name:5s} {int(np.sum(tiers == tier)):5d} users '
            f'{int(rows.sum()):6d} test events  '
            f'{_figures(data.label[rows], scores[rows])}')


if __name__ == '__main__':
  app.run(main)
