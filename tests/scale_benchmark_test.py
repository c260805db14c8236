"""End-to-end: `benchmarks/scale.py` at a tiny size, as CI runs it.

One round of PFedRec on synthetic data, once as one computation and once
in cohorts of 8 users: the table prints a row for each, with the cost
columns filled and the same test figures (cohorts change a round only by
float rounding).
"""

import os
import subprocess
import sys

_SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    'benchmarks', 'scale.py')


def test_the_table_has_a_row_per_cohort_size_with_the_same_figures(tmp_path):
  result = subprocess.run(
      [sys.executable, _SCRIPT, '--methods=pfedrec', '--datasets=synthetic',
       '--cohort_sizes=all,8', '--rounds=1', f'--root_dir={tmp_path}',
       '--extra_flags=--synthetic_users=40,--synthetic_items=600,'
       '--users_per_tff_client=4,--embedding_dim=8'],
      capture_output=True, text=True, timeout=600, cwd=tmp_path,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.splitlines()
  # The table follows its header, after the runs' own output.
  header = max(i for i, line in enumerate(lines)
               if line.split()[:3] == ['method', 'data', 'set'])
  rows = [line.split() for line in lines[header + 1:]]
  assert [row[2] for row in rows] == ['all', '8']
  for row in rows:
    assert row[3] == '1'  # rounds
    assert float(row[4]) > 0 and float(row[6]) > 0  # s/round, peak MB
  assert rows[0][7:] == rows[1][7:]
  assert [name for name in rows[0][7::2]] == ['auc', 'hr@10', 'ndcg@10']
  for cohort in ('all', '8'):
    assert os.path.exists(
        tmp_path / f'pfedrec_synthetic_{cohort}' / 'summary.json')
