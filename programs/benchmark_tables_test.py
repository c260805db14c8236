import numpy as np
import pytest

from tff_fedrec.programs import benchmark_tables


def _tiered_summary(method, recall, ndcg, small_ndcg, seconds, kib=116.7):
  return {
      'method': method,
      'rounds_completed': 960,
      'test': {
          'recall@20': recall,
          'ndcg@20': ndcg,
          'per_tier': {
              'small': {'users': 30, 'recall@20': recall, 'ndcg@20': small_ndcg},
              'medium': {'users': 18, 'recall@20': recall, 'ndcg@20': ndcg},
              'large': {'users': 12, 'recall@20': recall, 'ndcg@20': ndcg},
          },
      },
      'seconds_per_round': seconds,
      'peak_rss_mb': 3000.0,
      'bytes_per_client': {
          tier: {'upload': 1024 * size, 'download': 1024 * size}
          for tier, size in (('small', kib), ('medium', 233.8),
                             ('large', 467.8))
      },
  }


def test_mean_summary_averages_every_test_figure_and_the_cost():
  seeds = [
      _tiered_summary('hetefedrec', 0.10, 0.20, 0.05, 0.8),
      _tiered_summary('hetefedrec', 0.20, 0.30, 0.15, 1.0),
      _tiered_summary('hetefedrec', 0.30, 0.25, 0.10, 0.9, kib=120.0),
  ]
  mean = benchmark_tables.mean_summary(seeds)
  assert mean['test']['recall@20'] == pytest.approx(0.20)
  assert mean['test']['ndcg@20'] == pytest.approx(0.25)
  assert mean['test']['per_tier']['small']['ndcg@20'] == pytest.approx(0.10)
  assert mean['test']['per_tier']['small']['users'] == 30
  assert mean['seconds_per_round'] == pytest.approx(0.9)
  # Another seed's data can hold another number of items.
  assert mean['bytes_per_client']['small']['upload'] == pytest.approx(
      1024 * (116.7 + 116.7 + 120.0) / 3
  )
  assert mean['bytes_per_client']['large']['upload'] == pytest.approx(
      1024 * 467.8
  )
  assert mean['method'] == 'hetefedrec'
  assert mean['rounds_completed'] == 960
  # The inputs are left as they were.
  assert seeds[0]['test']['recall@20'] == 0.10


def test_mean_summary_of_nothing_is_refused():
  with pytest.raises(ValueError, match='at least one'):
    benchmark_tables.mean_summary([])


def test_leaders_name_each_seeds_best_method():
  runs = {
      'hetefedrec': [_tiered_summary('hetefedrec', 0.16, 0.26, 0.1, 1.0),
                     _tiered_summary('hetefedrec', 0.15, 0.25, 0.1, 1.0)],
      'all_large': [_tiered_summary('all_large', 0.15, 0.22, 0.1, 1.0),
                    _tiered_summary('all_large', 0.16, 0.26, 0.1, 1.0)],
  }
  assert benchmark_tables.leaders(runs, 'ndcg@20') == [
      'hetefedrec', 'all_large'
  ]
  assert benchmark_tables.leaders(runs, 'recall@20') == [
      'hetefedrec', 'all_large'
  ]


def _runs_with(metric, values):
  return [{'test': {metric: value}} for value in values]


def test_paired_difference_is_taken_seed_by_seed():
  # Seed 1 is a harder split for both: unpaired, its spread would swamp
  # the gap; paired, the gap is the same in every seed.
  first = _runs_with('ndcg@20', [0.26, 0.16, 0.25])
  second = _runs_with('ndcg@20', [0.25, 0.15, 0.24])
  difference = benchmark_tables.paired_difference(first, second, 'ndcg@20')
  assert difference.mean == pytest.approx(0.01)
  assert difference.standard_error == pytest.approx(0.0, abs=1e-12)
  assert (difference.seeds_first_higher, difference.seeds) == (3, 3)


def test_paired_difference_standard_error_and_seeds_higher():
  first = _runs_with('recall@20', [0.3, 0.5, 0.1])
  second = _runs_with('recall@20', [0.2, 0.2, 0.2])
  difference = benchmark_tables.paired_difference(first, second, 'recall@20')
  assert difference.mean == pytest.approx(0.1)
  assert difference.standard_error == pytest.approx(0.2 / np.sqrt(3))
  assert difference.seeds_first_higher == 2
  line = benchmark_tables.paired_difference_line(
      'hetefedrec', 'all_large', 'recall@20', difference)
  assert line == (
      'hetefedrec - all_large recall@20: +0.10000 (standard error 0.11547 '
      'over 3 seeds), hetefedrec higher in 2 of 3'
  )


def test_paired_difference_of_one_seed_has_no_standard_error():
  difference = benchmark_tables.paired_difference(
      _runs_with('ndcg@20', [0.2]), _runs_with('ndcg@20', [0.3]), 'ndcg@20')
  assert difference.mean == pytest.approx(-0.1)
  assert np.isnan(difference.standard_error)
  assert difference.seeds_first_higher == 0


def test_paired_difference_refuses_unpaired_runs():
  with pytest.raises(ValueError, match='same seeds'):
    benchmark_tables.paired_difference(
        _runs_with('ndcg@20', [0.2, 0.3]), _runs_with('ndcg@20', [0.3]),
        'ndcg@20')


def test_tiered_row_lines_up_with_its_header_and_shows_table_iii_bytes():
  row = benchmark_tables.tiered_row(
      'hetefedrec seed 0', _tiered_summary('hetefedrec', 0.15754, 0.2605,
                                           0.1576, 0.88)
  )
  assert len(row) == len(benchmark_tables.tiered_header())
  assert row.split()[:5] == ['hetefedrec', 'seed', '0', '960', '0.15754']
  assert '0.15760 / 0.26050 / 0.26050' in row
  assert '116.7 / 233.8 / 467.8' in row


def test_leave_one_out_row_of_a_mean_shows_the_mean_best_round():
  summaries = [
      {'method': 'pfedrec', 'rounds_completed': 100, 'best_round': best,
       'test': {'hr@10': hr, 'ndcg@10': hr / 2},
       'seconds_per_round': 1.0, 'peak_rss_mb': 900.0,
       'bytes_per_round': {'upload': 2e6, 'download': 4e6}}
      for best, hr in ((90, 0.70), (96, 0.72))
  ]
  row = benchmark_tables.leave_one_out_row(
      'pfedrec mean of 2', benchmark_tables.mean_summary(summaries)
  )
  assert len(row) == len(benchmark_tables.leave_one_out_header())
  assert row.split()[4:8] == ['100', '93', '0.7100', '0.3550']
