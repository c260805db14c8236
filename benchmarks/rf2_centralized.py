r"""RF²'s non-federated reference: DLRM or DIN trained on all training
events at once, as the paper's "Non-FL" (Sec. 5.1; the authors' code:
Adagrad with PyTorch's semantics at lr 0.1 on MovieLens, batches of 128,
one epoch, the same BCE + 1e-6 sum w^2 over the embedding tables), on the
click-through split the federated runs use. Prints the test AUC and
log-loss after each epoch, mean and standard error over seeds.

  .venv/bin/python benchmarks/rf2_centralized.py --dataset=ml-1m \
      --model=dlrm --seeds=0,1,2
"""

import collections
import statistics

import numpy as np
import tensorflow as tf
from absl import app
from absl import flags

from tff_fedrec import metrics
from tff_fedrec.algorithms.rf2 import models
from tff_fedrec.algorithms.rf2 import process
from tff_fedrec.templates import finalizers
from tff_fedrec.tasks import click_through
from tff_fedrec.tasks import movielens

_DATASET = flags.DEFINE_enum('dataset', 'ml-1m', ['ml-100k', 'ml-1m'],
                             'MovieLens data set (fetched and cached).')
_MODEL = flags.DEFINE_enum('model', 'dlrm', list(models.ARCHITECTURES),
                           'The model.')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds.')
_EPOCHS = flags.DEFINE_integer('epochs', 1, 'Epochs (the paper: 1).')
_BATCH = flags.DEFINE_integer('batch_size', 128, 'Batch size.')
_LEARNING_RATE = flags.DEFINE_float('learning_rate', 0.1, 'Adagrad rate.')


def _features(data, rows):
  return collections.OrderedDict(item=data.item[rows],
                                 genres=data.genres[rows],
                                 history=data.history[rows])


def train(data, spec, seed, epochs, batch_size, learning_rate):
  """Yields the test logits after each epoch."""
  params = tf.nest.map_structure(
      tf.Variable, models.initial_parameters(spec,
                                             np.random.default_rng(seed)))
  accumulator = tf.nest.map_structure(
      lambda v: tf.Variable(tf.zeros_like(v)), params)

  @tf.function
  def step(features, labels):
    with tf.GradientTape() as tape:
      values = tf.nest.map_structure(tf.convert_to_tensor, params)
      loss, _ = process.user_loss(spec, values, features, labels,
                                  tf.ones_like(labels))
      loss += process.EMBEDDING_L2 * models.embedding_l2(values)
    gradients = tf.nest.map_structure(
        tf.convert_to_tensor, tape.gradient(loss, values))
    new, new_accumulator = finalizers.adagrad_step(
        values, tf.nest.map_structure(tf.convert_to_tensor, accumulator),
        gradients, learning_rate=learning_rate, epsilon=1e-10)
    tf.nest.map_structure(lambda v, x: v.assign(x), params, new)
    tf.nest.map_structure(lambda v, x: v.assign(x), accumulator,
                          new_accumulator)

  scorer = tf.function(lambda features: models.logits(
      spec, tf.nest.map_structure(tf.convert_to_tensor, params), features))
  train_rows = np.flatnonzero(data.train)
  test_rows = np.flatnonzero(~data.train)
  rng = np.random.default_rng(seed)
  for _ in range(epochs):
    order = rng.permutation(train_rows)
    for start in range(0, order.size, batch_size):
      rows = order[start:start + batch_size]
      step(_features(data, rows), data.label[rows])
    yield np.concatenate([
        scorer(_features(data, test_rows[s:s + 65536])).numpy()
        for s in range(0, test_rows.size, 65536)])


def main(argv):
  del argv
  data = click_through.click_through_split(
      movielens.load_movielens(_DATASET.value),
      movielens.load_movie_genres(_DATASET.value))
  spec = models.ClickModelSpec(_MODEL.value, num_items=data.num_items,
                               num_genres=len(data.genre_names))
  labels = data.label[~data.train]
  figures = collections.defaultdict(list)
  for seed in map(int, _SEEDS.value):
    for epoch, logits in enumerate(train(
        data, spec, seed, _EPOCHS.value, _BATCH.value,
        _LEARNING_RATE.value), start=1):
      auc = metrics.binary_auc(labels, logits)
      loss = metrics.log_loss(labels, 1 / (1 + np.exp(-logits)))
      figures[epoch].append((auc, loss))
      print(f'seed {seed} epoch {epoch}: test AUC {auc:.4f} log-loss '
            f'{loss:.4f}', flush=True)
  for epoch, values in figures.items():
    aucs, losses = zip(*values)
    error = (statistics.stdev(aucs) / len(aucs)**0.5 if len(aucs) > 1
             else float('nan'))
    print(f'{_DATASET.value} {_MODEL.value} centralised, epoch {epoch}: AUC '
          f'{statistics.fmean(aucs):.4f} +- {error:.4f} (s.e., '
          f'{len(aucs)} seeds), log-loss {statistics.fmean(losses):.4f}')


if __name__ == '__main__':
  app.run(main)
