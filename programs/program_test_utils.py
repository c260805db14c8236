"""Runs a program's `main` in-process, as its binary would, for tests.

A refusal (bad flags, a missing file) ends before any TensorFlow work, so
its test calls `main` here instead of paying a TensorFlow import for a
subprocess. `tests/end_to_end_test.py` still starts the real binaries for
a few refusals, to check the entry points themselves.
"""

from collections.abc import Callable, Sequence

from absl import flags
import pytest


def exit_status_and_stderr(
    program: str,
    main: Callable[[Sequence[str]], None],
    args: Sequence[str],
    capsys: pytest.CaptureFixture[str],
) -> tuple[int | str | None, str]:
  """Parses `args` as `program`'s command line and calls `main`.

  `main` must end with `SystemExit` (a test that reaches here expects a
  refusal). The flags are parsed inside the `try` whose `finally` unparses
  them: absl keeps the values a failed parse had already set, and they
  would leak into the next case.

  Returns:
    The exit code and what the program wrote to stderr.
  """
  try:
    flags.FLAGS([program, *args])
    with pytest.raises(SystemExit) as exit_info:
      main([program])
  finally:
    flags.FLAGS.unparse_flags()
  return exit_info.value.code, capsys.readouterr().err
