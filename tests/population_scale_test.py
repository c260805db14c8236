"""End-to-end: `benchmarks/population_scale.py` on 10,000 synthetic users
with their client state on disk, as CI runs it.

Two rounds of PFedRec, 1,000 clients a round: the table's row has the
run's own figures (read back from its summary and checkpoints), the
database holds the states of the users that trained, the plot is written,
and a second call finds the run done and trains nothing.
"""

import json
import os
import sqlite3
import subprocess
import sys

_SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    'benchmarks', 'population_scale.py')


def test_ten_thousand_users_on_disk(tmp_path):
  command = [sys.executable, _SCRIPT, '--points=10000:1000', '--rounds=2',
             f'--root_dir={tmp_path}', f'--plot={tmp_path / "plot.png"}',
             f'--extra_flag=--cache_dir={tmp_path / "cache"}']
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.splitlines()
  header = max(i for i, line in enumerate(lines)
               if line.split()[:2] == ['users', 'clients'])
  row = lines[header + 1].split()
  assert row[:2] == ['10,000', '1,000']
  run_dir = tmp_path / 'users10000_clients1000_disk'
  with open(run_dir / 'summary.json') as file:
    summary = json.load(file)
  assert summary['num_users'] == 10000 and summary['rounds_completed'] == 2
  assert float(row[3]) == round(summary['peak_rss_mb'])
  assert float(row[7]) == round(summary['test']['hr@10'], 4)
  # Two rounds of 1,000 users: at most 2,000 users hold rows of their own;
  # the other 8,000 hold the initial state without one.
  database = sqlite3.connect(run_dir / 'checkpoints' / 'client_states.sqlite')
  (trained,) = database.execute('SELECT count(*) FROM ragged_1').fetchone()
  (round_num,) = database.execute(
      "SELECT value FROM meta WHERE key = 'round'").fetchone()
  database.close()
  assert 1000 <= trained <= 2000 and round_num == 2
  assert (tmp_path / 'plot.png').stat().st_size > 10_000
  again = subprocess.run(command, capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
  assert again.returncode == 0 and '$ ' not in again.stdout
  assert again.stdout.splitlines()[-2:] == lines[-2:]
