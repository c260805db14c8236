"""End-to-end: `benchmarks/fairness_grid.py` on a tiny synthetic grid of
PFedRec, as a user runs it: its runs, progress lines, table and figures;
run again, it trains nothing and prints the same table."""

import os
import subprocess
import sys

_SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    'benchmarks', 'fairness_grid.py')


def _grid(out_dir):
  result = subprocess.run(
      [sys.executable, _SCRIPT, '--method=pfedrec', f'--out_dir={out_dir}',
       '--run_flags=--dataset=synthetic --synthetic_users=60 '
       '--synthetic_items=120 --num_eval_negatives=29 --rounds=2',
       '--mappings=round_robin', '--optimizations=quant:2,4,32',
       '--seeds=0,1', '--epochs=0'],
      capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout.splitlines()


def test_the_grid_trains_each_run_once_and_reports_it(tmp_path):
  lines = _grid(tmp_path)
  progress = [line for line in lines if line.startswith('[grid]')]
  assert len(progress) == 4  # 2 seeds x (baseline + 1 optimisation).
  assert progress[-1].startswith('[grid] 4/4 runs done (4 trained now')
  rows = {tuple(line.split()[:2]): line.split() for line in lines
          if line.startswith('round_robin')}
  assert set(rows) == {('round_robin', 'none'),
                       ('round_robin', 'quant:2,4,32')}
  assert all(row[2] == '2' for row in rows.values())  # Both seeds.
  for name in ('pfedrec_mdac.png', 'pfedrec_per_tier.png'):
    with open(tmp_path / 'figures' / name, 'rb') as figure:
      assert figure.read(8) == b'\x89PNG\r\n\x1a\n'
  # Resumed: every run is finished, so nothing trains again.
  again = _grid(tmp_path)
  assert [line for line in again if line.startswith('[grid] 4/4')] == [
      '[grid] 4/4 runs done (0 trained now, 0 s each); ETA 0.00 h']
  assert [line for line in again if line.startswith('round_robin')] == [
      line for line in lines if line.startswith('round_robin')]
