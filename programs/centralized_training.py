"""Centralised Fed-NCF on HeteFedRec's protocol: the training behind
`programs.centralized` (a reference point for the tiered methods).

One Fed-NCF model (Eq. 5: FFN([u ; v]), N(0, s^2) embeddings, PyTorch-style
uniform dense layers as in `hetefedrec.models`), the TF Recommenders form of
the tiers' architecture with every user's embedding in a table
(`models.RecommenderModel`), is trained on every user's training data
pooled on one machine, with minibatch Adam on its `Ranking` task, Eq. 2's
binary cross-entropy. Negatives are redrawn every epoch from outside each user's
training items (`random_split.training_examples`), and every epoch is
scored by the tiered methods' full ranking
(`random_split.tiered_ranking_metrics`).
"""

import collections
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from tff_fedrec import models
from tff_fedrec.algorithms.hetefedrec import models as hetero_models
from tff_fedrec.tasks import preprocessing
from tff_fedrec.tasks import random_split


def train_centralized(
    data: preprocessing.RandomSplitData,
    *,
    epochs: int,
    width: int = 32,
    hidden_units: Sequence[int] = (8, 8),
    learning_rate: float = 0.001,
    batch_size: int = 1024,
    negatives_per_positive: int = 4,
    init_scale: float = 0.01,
    user_tiers: Sequence[int],
    seed: int = 0,
    k: int = random_split.TOP_K,
    log: Callable[[str], None] = print,
) -> list[dict]:
  """Trains for `epochs` epochs; returns each epoch's `tiered_ranking_metrics`
  (plus 'epoch' and 'loss', the epoch's mean training loss)."""
  if epochs < 1 or width < 1 or batch_size < 1:
    raise ValueError(
        f'epochs, width and batch_size must be positive; got {epochs}, '
        f'{width}, {batch_size}.'
    )
  rng = np.random.default_rng(seed)
  users = rng.normal(scale=init_scale, size=(data.num_users, width))
  items = rng.normal(scale=init_scale, size=(data.num_items, width))
  spec = models.RecommenderSpec(
      'neural_cf', data.num_items, width, tuple(hidden_units),
      personal_score_layers=False, split_first_layer=True,
  )
  model = models.RecommenderModel(
      spec,
      collections.OrderedDict(
          item_embedding=items.astype(np.float32),
          user_embedding=users.astype(np.float32),
          score_layers=models.initial_dense_layers(
              rng, hetero_models.score_layer_shapes(width, hidden_units)),
      ),
      user_embedding='table',
  )
  optimizer = tf.keras.optimizers.Adam(learning_rate)

  @tf.function
  def step(user_ids, item_ids, labels):
    with tf.GradientTape() as tape:
      loss = model.compute_loss(
          {'user_ids': user_ids, 'item_ids': item_ids, 'labels': labels})
    variables = model.trainable_variables
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return loss

  def score_users(tier, tier_users, *_):
    del tier
    return model.score_users(tier_users).numpy()

  all_users = np.arange(data.num_users)
  history = []
  for epoch in range(epochs):
    examples = random_split.training_examples(
        data, negatives_per_positive, all_users,
        np.random.default_rng([seed, epoch]),
    )
    owner = np.repeat(all_users, np.diff(examples.offsets)).astype(np.int32)
    order = np.random.default_rng([seed, epoch]).permutation(owner.size)
    owner = owner[order]
    example_items = examples.items[order].astype(np.int32)
    labels = examples.labels[order].astype(np.float32)
    losses = [
        float(step(owner[s:s + batch_size], example_items[s:s + batch_size],
                   labels[s:s + batch_size]))
        for s in range(0, owner.size, batch_size)
    ]
    result = random_split.tiered_ranking_metrics(
        data, np.asarray(user_tiers), score_users, k
    )
    result.update(epoch=epoch + 1, loss=float(np.mean(losses)))
    history.append(result)
    log(
        f'epoch {epoch + 1:3d}  loss {result["loss"]:.4f}  Recall@{k} '
        f'{result[f"recall@{k}"]:.5f}  NDCG@{k} {result[f"ndcg@{k}"]:.5f}  '
        + '  '.join(
            f'{name} {tier[f"ndcg@{k}"]:.4f}'
            for name, tier in result['per_tier'].items()
        )
    )
  return history
