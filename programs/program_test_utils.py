"""Runs a program's `main` in-process, as its binary would, for tests.

A subprocess costs a TensorFlow import, about 10 s here, more than a short
run or a refusal itself. So most tests call `main` in the test process:
refusals (bad flags, a missing file) through `exit_status_and_stderr`, and
short runs through `run_main`. `tests/end_to_end_test.py` and
`tests/export_test.py` still start the real binaries where the process is
what is tested: the entry points, killed runs and workers, and what a
finished binary leaves running.
"""

import contextlib
import csv
import hashlib
import io
import json
import os
import sys
from collections.abc import Callable, Sequence

from absl import flags
import pytest

from tff_fedrec.programs import worker_processes


def _call_main(
    program: str, main: Callable[[Sequence[str]], None], args: Sequence[str]
) -> tuple[int | str | None, str, str]:
  """Parses `args` as `program`'s command line and calls `main`.

  The flags are parsed inside the `try` whose `finally` unparses them:
  absl keeps the values a failed parse had already set, and they would
  leak into the next case. Asserts that the program, whether it returned
  or exited, stopped every TFF worker it started.

  Returns:
    The exit status (None if `main` returned), and what the program wrote
    to stdout and to stderr.
  """
  stdout, stderr = io.StringIO(), io.StringIO()
  status = None
  workers_before = set(worker_processes.running_worker_children())
  try:
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
      flags.FLAGS([program, *args])
      try:
        main([program])
      except SystemExit as exit_info:
        status = exit_info.code
  except BaseException:
    # An uncaught error fails the test: pass on what the program wrote, so
    # pytest shows it with the traceback.
    sys.stdout.write(stdout.getvalue())
    sys.stderr.write(stderr.getvalue())
    raise
  finally:
    flags.FLAGS.unparse_flags()
  left_running = (
      set(worker_processes.running_worker_children()) - workers_before
  )
  assert not left_running, (
      f'{program} left its TFF worker(s) {sorted(left_running)} running'
  )
  return status, stdout.getvalue(), stderr.getvalue()


def exit_status_and_stderr(
    program: str, main: Callable[[Sequence[str]], None], args: Sequence[str]
) -> tuple[int | str | None, str]:
  """Runs `main` on `args`, which must make it exit (a refusal).

  Returns:
    The exit status and what the program wrote to stderr.
  """
  status, _, stderr = _call_main(program, main, args)
  assert status is not None, f'{program} {args} returned instead of exiting'
  return status, stderr


def run_main(
    program: str, main: Callable[[Sequence[str]], None], args: Sequence[str]
) -> str:
  """Runs `main` on `args` to its end; returns what it wrote to stdout.

  Fails the test, with the end of stderr, if `main` exits instead of
  returning (every program here exits only to refuse or fail).
  """
  status, stdout, stderr = _call_main(program, main, args)
  if status is not None:
    pytest.fail(f'{program} exited with status {status}:\n{stderr[-3000:]}')
  return stdout


def read_summary(root_dir: str) -> dict:
  """The summary.json a finished run wrote into `root_dir`."""
  with open(os.path.join(root_dir, 'summary.json')) as f:
    return json.load(f)


def read_metrics(root_dir: str) -> list[dict[str, str]]:
  """The rows of the metrics.csv a run wrote into `root_dir`."""
  with open(os.path.join(root_dir, 'metrics.csv')) as f:
    return list(csv.DictReader(f))


def assert_figures_close(actual, expected, abs: float = 1e-6) -> None:
  """Asserts that two (nested) dicts of figures have the same keys and
  numbers within `abs` (a summary's `test`, per tier included)."""
  if isinstance(expected, dict):
    assert isinstance(actual, dict) and actual.keys() == expected.keys(), (
        actual, expected)
    for key in expected:
      assert_figures_close(actual[key], expected[key], abs)
  else:
    assert actual == pytest.approx(expected, abs=abs)


def snapshot(root_dir: str) -> dict[str, str]:
  """{relative path: SHA-256, or 'folder'} of everything under `root_dir`,
  to check that a refusal left it byte for byte as it was."""
  files = {}
  for folder, folders, names in os.walk(root_dir):
    for name in folders:
      files[os.path.relpath(os.path.join(folder, name), root_dir)] = 'folder'
    for name in names:
      path = os.path.join(folder, name)
      with open(path, 'rb') as f:
        files[os.path.relpath(path, root_dir)] = hashlib.sha256(
            f.read()).hexdigest()
  return files


def refused(
    program: str, main: Callable[[Sequence[str]], None],
    args: Sequence[str], *messages: str,
) -> str:
  """Runs `main` on `args`: it must exit non-zero without a traceback,
  its stderr holding every one of `messages`; returns that stderr."""
  status, stderr = exit_status_and_stderr(program, main, args)
  assert status not in (None, 0), stderr
  assert 'Traceback' not in stderr, stderr
  for message in messages:
    assert message in stderr, stderr
  return stderr
