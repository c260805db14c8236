r"""Most-popular baseline on HeteFedRec's protocol (reference point, no training).

Scores every item by its number of training interactions and ranks each
user's non-training items by that score: the same random split, tiers and
full-ranking Recall@20 / NDCG@20 as the tiered methods
(`tasks.random_split`), overall and per tier. A federated model that does
not beat this has learned item popularity and nothing personal.

  python -m tff_fedrec.programs.popularity --dataset=ml-1m
"""

from absl import app

from tff_fedrec.programs import random_split_flags
from tff_fedrec.tasks import random_split


def main(argv):
  del argv
  data = random_split_flags.load_split()
  result = random_split.popularity_metrics(
      data, random_split_flags.user_tiers(data)
  )
  print(f'most popular on {random_split_flags.DATASET.value}: Recall@20 '
        f'{result["recall@20"]:.5f}  NDCG@20 {result["ndcg@20"]:.5f}')
  for name, tier in result['per_tier'].items():
    print(f'  {name:<6} ({tier["users"]} users)  Recall@20 '
          f'{tier["recall@20"]:.5f}  NDCG@20 {tier["ndcg@20"]:.5f}')


if __name__ == '__main__':
  app.run(main)
