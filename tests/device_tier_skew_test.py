"""End-to-end: `benchmarks/device_tier_skew.py` on MovieLens-100K, as a
user runs it: RF² Fig. 4's analogue, no training."""

import os
import subprocess
import sys

_SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    'benchmarks', 'device_tier_skew.py')


def test_smaller_alpha_puts_more_of_a_top_item_s_clickers_in_one_tier():
  result = subprocess.run(
      [sys.executable, _SCRIPT, '--dataset=ml-100k', '--seeds=0,1'],
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.splitlines()
  # 943 users; 21,201 ratings of 5 (counted in the file independently:
  # awk -F'\t' '$3 >= 5' ml-100k.inter | wc -l).
  assert lines[0].startswith('ml-100k: 943 users, 21201 clicks')
  rows = {line.split()[0]: line.split() for line in lines[2:]}
  assert list(rows) == ['round_robin', 'dirichlet:5000', 'dirichlet:5',
                        'dirichlet:0.5', 'dirichlet:0.05', 'dirichlet:0.005']
  sizes = [int(n) for n in rows['round_robin'][1:6:2]]
  assert sum(sizes) == 943 and max(sizes) - min(sizes) <= 1
  share = {name: float(row[-3]) for name, row in rows.items()}
  assert share['round_robin'] < 0.4 and share['dirichlet:5000'] < 0.4
  assert share['dirichlet:5000'] < share['dirichlet:0.5'] < share[
      'dirichlet:0.005']
