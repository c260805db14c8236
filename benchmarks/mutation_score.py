"""Mutation score of the library's math modules under their own tests.

Not part of CI (issue 28). mutmut 2.4.5 generates the mutants; running them
through `mutmut run` imports TensorFlow once per mutant (30-80 s here), so
this script applies each mutant to a copy of the tree and runs the module's
`_test.py` with `pytest.main` in one process that keeps TensorFlow and TFF
imported, dropping every `tff_fedrec` module between mutants (0.2-2 s a
mutant). A mutant is killed when a test fails or it runs 3x longer than
the unmutated tests (at least 60 s).

mutmut is not in the project's lock; install it beside it:

  python3.11 -m venv /tmp/mutmut && /tmp/mutmut/bin/pip install mutmut==2.4.5
  .venv/bin/python benchmarks/mutation_score.py \\
      --mutmut_site=/tmp/mutmut/lib/python3.11/site-packages \\
      --out_dir=runs/mutation adam privacy scoring
  (--sample=N runs N mutants drawn at random, for slow tests.)

Writes OUT_DIR/<module>.jsonl (one line per mutant; a rerun skips the
mutants already there) and prints, per module, killed / total and the
survivors (line, mutated text).
"""

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mutants(path: str, mutmut_site: str) -> tuple[str, list[dict]]:
  """(the module's source, one dict per mutant with its mutated source)."""
  sys.path.append(mutmut_site)
  try:
    import mutmut  # pylint: disable=import-outside-toplevel
  finally:
    sys.path.remove(mutmut_site)
  with open(path) as f:
    source = f.read()
  original_lines = set(source.split('\n'))
  result = []
  for mutation_id in mutmut.list_mutations(
      mutmut.Context(source=source, filename=path)
  ):
    mutated, _ = mutmut.mutate(mutmut.Context(
        source=source, filename=path, mutation_id=mutation_id))
    changed = [l for l in mutated.split('\n') if l not in original_lines]
    result.append(dict(
        line_number=mutation_id.line_number + 1,
        line=mutation_id.line.strip(),
        index=mutation_id.index,
        mutated_line=changed[0].strip() if changed else '(line removed)',
        source=mutated,
    ))
  return source, result


class _TimedOut(Exception):
  pass


def _raise_timed_out(signum, frame):
  del signum, frame
  raise _TimedOut()


def _tests_pass(test_path: str, timeout: int) -> str:
  """'passed', 'failed' or 'timed out': the module's tests on the tree as
  it is on disk now."""
  for name in [m for m in sys.modules if m.startswith('tff_fedrec')]:
    del sys.modules[name]
  import pytest  # pylint: disable=import-outside-toplevel
  signal.signal(signal.SIGALRM, _raise_timed_out)
  signal.alarm(timeout)
  output = io.StringIO()
  try:
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(
        output
    ):
      code = pytest.main(['-x', '-q', '-p', 'no:cacheprovider',
                          '--durations=0', '-W', 'ignore', test_path])
    return 'passed' if code == 0 else 'failed'
  except _TimedOut:
    return 'timed out'
  finally:
    signal.alarm(0)


def _copy_tree(destination: str) -> None:
  files = subprocess.run(
      ['git', 'ls-files', '-z'], cwd=_REPO, check=True, capture_output=True
  ).stdout.decode().split('\0')
  for name in filter(None, files):
    target = os.path.join(destination, name)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copy2(os.path.join(_REPO, name), target)


def score_module(tree: str, module: str, out_path: str,
                 mutmut_site: str, sample: int = 0) -> list[dict]:
  """Runs every mutant of tff_fedrec/<module>.py not yet in `out_path`, or
  `sample` of them drawn at random (seed 0) if `sample` is positive."""
  path = os.path.join(tree, 'tff_fedrec', f'{module}.py')
  test_path = os.path.join(tree, 'tff_fedrec', f'{module}_test.py')
  source, mutants = _mutants(path, mutmut_site)
  if 0 < sample < len(mutants):
    mutants = random.Random(0).sample(mutants, sample)
  records = []
  if os.path.exists(out_path):
    with open(out_path) as f:
      records = [json.loads(line) for line in f]
  done = {(r['line_number'], r['index'], r['line']) for r in records}
  start = time.monotonic()
  if _tests_pass(test_path, timeout=3600) != 'passed':
    raise SystemExit(f'{test_path} fails on the unmutated tree.')
  timeout = int(max(60, 3 * (time.monotonic() - start)))
  try:
    for mutant in mutants:
      if (mutant['line_number'], mutant['index'], mutant['line']) in done:
        continue
      with open(path, 'w') as f:
        f.write(mutant['source'])
      outcome = _tests_pass(test_path, timeout)
      record = {k: v for k, v in mutant.items() if k != 'source'}
      record['status'] = 'survived' if outcome == 'passed' else 'killed'
      record['outcome'] = outcome
      records.append(record)
      with open(out_path, 'a') as f:
        f.write(json.dumps(record) + '\n')
  finally:
    with open(path, 'w') as f:
      f.write(source)
  return records


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('modules', nargs='+',
                      help='modules of tff_fedrec/, e.g. adam')
  parser.add_argument('--mutmut_site', required=True,
                      help="site-packages of a venv holding mutmut 2.4.5")
  parser.add_argument('--out_dir', required=True)
  parser.add_argument('--sample', type=int, default=0,
                      help='run this many mutants drawn at random (seed 0) '
                      'instead of all: for modules whose tests take '
                      'minutes')
  args = parser.parse_args()
  os.makedirs(args.out_dir, exist_ok=True)
  out_dir = os.path.abspath(args.out_dir)
  with tempfile.TemporaryDirectory(prefix='mutation_tree_') as tree:
    _copy_tree(tree)
    os.chdir(tree)
    sys.path.insert(0, tree)
    for module in args.modules:
      records = score_module(
          tree, module, os.path.join(out_dir, f'{module}.jsonl'),
          args.mutmut_site, args.sample,
      )
      killed = sum(r['status'] == 'killed' for r in records)
      print(f'{module}: {killed} of {len(records)} mutants killed '
            f'({100 * killed / max(1, len(records)):.1f}%)', flush=True)
      for r in records:
        if r['status'] == 'survived':
          print(f'  survived line {r["line_number"]}: {r["mutated_line"]}',
                flush=True)


if __name__ == '__main__':
  main()
