"""End-to-end: `benchmarks/click_through_floor.py` on MovieLens-100K, as a
user runs it: the click-through split and its floor, per device tier."""

import math
import os
import re
import subprocess
import sys

from tff_fedrec.tasks import movielens

_SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    'benchmarks', 'click_through_floor.py')


def test_the_split_and_the_movie_click_rate_floor_per_tier():
  result = subprocess.run(
      [sys.executable, _SCRIPT, '--dataset=ml-100k',
       '--device_tiers=round_robin,dirichlet:0.05'],
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.splitlines()
  # The split's sizes, counted here from the file independently: each
  # user's first ceil(0.9 n) events train.
  frame = movielens.load_movielens('ml-100k')
  sizes = frame.groupby('user').size()
  train = int(sum(math.ceil(0.9 * n) for n in sizes))
  assert lines[0].startswith(
      f'ml-100k: 943 users, 1682 movies, 19 genres, 100000 events: {train} '
      'train')
  assert f'{100000 - train} test' in lines[0]
  overall = float(re.search(r'AUC (\S+)', lines[1]).group(1))
  assert 0.6 < overall < 0.9  # A movie's click rate predicts clicks.
  for mapping in ('round_robin', 'dirichlet:0.05'):
    rows = [line.split() for line in lines[2:] if line.split()[0] == mapping]
    assert [row[1] for row in rows] == ['low', 'mid', 'high']
    assert sum(int(row[2]) for row in rows) == 943
    assert sum(int(row[4]) for row in rows) == 100000 - train
