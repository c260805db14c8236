"""End-to-end: `python -m tff_fedrec.programs.benchmark` as a user runs it.

Two one-round seeds of two tiered methods on synthetic data: the
benchmark trains each through the train program, with the extra flags it
was given, and prints each seed, their mean and the two methods' paired
difference from the runs' summaries. Its table
logic has unit tests of its own (`programs/benchmark_tables_test.py`).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

_DATA_FLAGS = (
    '--synthetic_users=40,--synthetic_items=150,--clients_per_round=20,'
    '--tier_widths=2,4,8,--eval_every=1'
)


def _benchmark(args, cwd):
  return subprocess.run(
      [sys.executable, '-m', 'tff_fedrec.programs.benchmark',
       '--dataset=synthetic', '--rounds=1', *args],
      capture_output=True, text=True, timeout=600, cwd=cwd,
  )


def _row(stdout, label):
  """The figures of the table row labelled `label`."""
  line = next(l for l in stdout.splitlines() if l.startswith(label + ' '))
  return line[len(label):].split()


def test_seeds_run_with_the_extra_flags_and_their_mean_is_printed(tmp_path):
  result = _benchmark([
      '--methods=all_small,all_large', '--seeds=0,1', f'--root_dir={tmp_path}',
      f'--extra_flags={_DATA_FLAGS}',
  ], cwd=tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  recalls = []
  for seed in (0, 1):
    run_dir = tmp_path / 'all_small' / f'seed_{seed}'
    flags_text = (run_dir / 'run.flags').read_text()
    # A list value inside --extra_flags keeps its commas.
    assert '--tier_widths=2,4,8' in flags_text
    assert f'--seed={seed}' in flags_text
    summary = json.loads((run_dir / 'summary.json').read_text())
    assert summary['rounds_completed'] == 1
    row = _row(result.stdout, f'all_small seed {seed}')
    assert row[0] == '1'  # rounds
    assert float(row[1]) == pytest.approx(summary['test']['recall@20'],
                                          abs=1e-5)
    recalls.append(summary['test']['recall@20'])
  # Each seed is its own split, so the two runs differ.
  assert recalls[0] != recalls[1]
  mean_row = _row(result.stdout, 'all_small mean of 2')
  assert float(mean_row[1]) == pytest.approx(np.mean(recalls), abs=1e-5)
  # The first method named against each other one, seed by seed.
  large_recalls = [
      json.loads((tmp_path / 'all_large' / f'seed_{seed}' / 'summary.json')
                 .read_text())['test']['recall@20'] for seed in (0, 1)
  ]
  differences = np.subtract(recalls, large_recalls)
  paired = _row(result.stdout, 'all_small - all_large recall@20:')
  assert float(paired[0]) == pytest.approx(np.mean(differences), abs=1e-5)
  assert paired[-3:] == [str(int(np.sum(differences > 0))), 'of', '2']


def test_a_failed_run_stops_the_benchmark_naming_it(tmp_path):
  result = _benchmark([
      '--methods=all_small', f'--root_dir={tmp_path}',
      f'--extra_flags={_DATA_FLAGS},--tier_ratio=1,1',
  ], cwd=tmp_path)
  assert result.returncode == 2
  assert '--tier_ratio needs 3 values' in result.stderr  # The train program.
  assert 'the all_small run exited with status 2' in result.stderr
  assert 'Traceback' not in result.stderr


def test_an_unknown_method_is_refused_before_any_run(tmp_path):
  result = _benchmark(
      ['--methods=all_small,nosuch', f'--root_dir={tmp_path}'], cwd=tmp_path
  )
  assert result.returncode != 0
  assert 'Unknown method(s) nosuch' in result.stderr
  assert not os.listdir(tmp_path)
