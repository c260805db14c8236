r"""Most-popular baseline on HeteFedRec's protocol (reference point, no training).

Scores every item by its number of training interactions and ranks each
user's non-training items by that score: the same random split, tiers and
full-ranking Recall@20 / NDCG@20 as the tiered methods
(`hetero_training_loop`), overall and per tier. A federated model that does
not beat this has learned item popularity and nothing personal.

  python -m tff_fedrec.programs.popularity --dataset=ml-1m
"""

from absl import app
from absl import flags

from tff_fedrec.programs import hetero_training_loop
from tff_fedrec.tasks import datasets

_DATASET = flags.DEFINE_enum(
    'dataset', 'ml-1m', [d for d in datasets.DATASETS if d != 'file'],
    'Data set.'
)
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the random split.')
_TIER_RATIO = flags.DEFINE_list('tier_ratio', ['5', '3', '2'], 'Tier shares.')


def main(argv):
  del argv
  data = datasets.load_random_split(
      datasets.DataConfig(dataset=_DATASET.value, seed=_SEED.value)
  )
  ratio = tuple(float(r) for r in _TIER_RATIO.value)
  result = hetero_training_loop.popularity_metrics(data, ratio)
  print(f'most popular on {_DATASET.value}: Recall@20 '
        f'{result["recall@20"]:.5f}  NDCG@20 {result["ndcg@20"]:.5f}')
  for name, tier in result['per_tier'].items():
    print(f'  {name:<6} ({tier["users"]} users)  Recall@20 '
          f'{tier["recall@20"]:.5f}  NDCG@20 {tier["ndcg@20"]:.5f}')


if __name__ == '__main__':
  app.run(main)
