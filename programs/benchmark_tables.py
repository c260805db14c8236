"""The benchmark's tables: one row per run, the mean over seeds, the leaders.

A run is its `summary.json` as a dict. The benchmark (`benchmark.py`) runs
each method once per seed; these functions turn the summaries into the
lines it prints. A paper's ordering claim ("HeteFedRec is above All Large",
HeteFedRec Table II) is about the mean and about every seed, so both are
shown: `mean_summary` averages the figures over seeds and `leaders` names
the method with the highest value of a metric in each seed.
`paired_difference` says how far apart two methods are, seed by seed, and
how much of that the seeds' spread can explain.
"""

from collections.abc import Mapping, Sequence
import dataclasses
import math

import numpy as np

_TIERS = ('small', 'medium', 'large')


def mean_summary(summaries: Sequence[Mapping]) -> dict:
  """The summary whose numbers are the means over `summaries` (seeds).

  Numbers anywhere under 'test', 'bytes_per_client' and 'bytes_per_round'
  (a seed can change the data, so the item count), and 'best_round',
  'seconds_per_round' and 'peak_rss_mb', are averaged; everything else
  (method, rounds, configuration) is the first summary's. Every summary
  must hold the same keys.

  For example, test ndcg@20 of 0.2 and 0.3 give 0.25.
  """
  if not summaries:
    raise ValueError('mean_summary needs at least one summary.')

  def mean(values):
    first = values[0]
    if isinstance(first, Mapping):
      return {key: mean([v[key] for v in values]) for key in first}
    if isinstance(first, (int, float)) and not isinstance(first, bool):
      return float(np.mean(values))
    return first

  result = dict(summaries[0])
  for key in ('test', 'bytes_per_client', 'bytes_per_round', 'best_round',
              'seconds_per_round', 'peak_rss_mb'):
    if key in result:
      result[key] = mean([s[key] for s in summaries])
  return result


def leaders(
    summaries_by_method: Mapping[str, Sequence[Mapping]], metric: str
) -> list[str]:
  """The method with the highest test `metric` in each seed, seed by seed.

  `summaries_by_method[m][i]` is method m's run with the i-th seed.
  """
  methods = list(summaries_by_method)
  num_seeds = len(summaries_by_method[methods[0]])
  return [
      max(methods, key=lambda m: summaries_by_method[m][i]['test'][metric])
      for i in range(num_seeds)
  ]


@dataclasses.dataclass(frozen=True)
class PairedDifference:
  """`first` minus `second` in a test metric, over seeds paired by seed.

  Attributes:
    mean: the mean over seeds of the per-seed difference.
    standard_error: the sample standard deviation (n - 1) of the per-seed
      differences over sqrt(n); NaN with one seed.
    seeds_first_higher: in how many seeds `first` scored higher.
    seeds: the number of seeds.
  """
  mean: float
  standard_error: float
  seeds_first_higher: int
  seeds: int


def paired_difference(
    first: Sequence[Mapping], second: Sequence[Mapping], metric: str
) -> PairedDifference:
  """`first[i]` minus `second[i]` in test `metric`, for every seed i.

  A seed fixes the split and the initial models of both runs, so the
  difference is taken within each seed before it is averaged: the spread
  between seeds, which both methods share, then drops out of the mean, and
  what is left in the standard error is how much the gap itself moves.
  For example, differences of 0.1, 0.3 and -0.1 give a mean of 0.1, a
  standard error of 0.2 / sqrt(3) and `first` higher in 2 of 3 seeds.
  """
  if len(first) != len(second) or not first:
    raise ValueError(
        f'paired_difference needs the same seeds for both methods; got '
        f'{len(first)} and {len(second)} runs.'
    )
  differences = np.array([
      a['test'][metric] - b['test'][metric] for a, b in zip(first, second)
  ])
  seeds = len(differences)
  standard_error = (
      float(np.std(differences, ddof=1)) / math.sqrt(seeds)
      if seeds > 1 else math.nan
  )
  return PairedDifference(
      mean=float(np.mean(differences)),
      standard_error=standard_error,
      seeds_first_higher=int(np.sum(differences > 0)),
      seeds=seeds,
  )


def paired_difference_line(
    first: str, second: str, metric: str, difference: PairedDifference
) -> str:
  return (
      f'{first} - {second} {metric}: {difference.mean:+.5f} '
      f'(standard error {difference.standard_error:.5f} over '
      f'{difference.seeds} seeds), {first} higher in '
      f'{difference.seeds_first_higher} of {difference.seeds}'
  )


def tiered_header() -> str:
  return (
      f'{"method":<26} {"rounds":>6} {"Recall@20":>9} {"NDCG@20":>8} '
      f'{"NDCG@20 s / m / l":>27} {"s/round":>8} {"peak MB":>8} '
      f'{"KiB up/client s / m / l":>26}'
  )


def tiered_row(label: str, summary: Mapping) -> str:
  """One line of HeteFedRec's table: overall, per tier, cost, Table III."""
  tiers = summary['test']['per_tier']
  per_tier = ' / '.join(f'{tiers[t]["ndcg@20"]:.5f}' for t in _TIERS)
  sent = ' / '.join(
      f'{summary["bytes_per_client"][t]["upload"] / 1024:.1f}' for t in _TIERS
  )
  return (
      f'{label:<26} {summary["rounds_completed"]:>6} '
      f'{summary["test"]["recall@20"]:>9.5f} '
      f'{summary["test"]["ndcg@20"]:>8.5f} {per_tier:>27} '
      f'{summary["seconds_per_round"]:>8.2f} {summary["peak_rss_mb"]:>8.0f} '
      f'{sent:>26}'
  )


def leave_one_out_header() -> str:
  return (
      f'{"method":<26} {"rounds":>6} {"best":>5} {"HR@10":>7} {"NDCG@10":>8} '
      f'{"s/round":>8} {"peak MB":>8} {"up MB/rd":>9} {"down MB/rd":>10}'
  )


def leave_one_out_row(label: str, summary: Mapping) -> str:
  """One line of PFedRec's / FedRAS's table, at the best validation round."""
  return (
      f'{label:<26} {summary["rounds_completed"]:>6} '
      f'{summary["best_round"]:>5.0f} {summary["test"]["hr@10"]:>7.4f} '
      f'{summary["test"]["ndcg@10"]:>8.4f} '
      f'{summary["seconds_per_round"]:>8.2f} {summary["peak_rss_mb"]:>8.0f} '
      f'{summary["bytes_per_round"]["upload"] / 1e6:>9.1f} '
      f'{summary["bytes_per_round"]["download"] / 1e6:>10.1f}'
  )
