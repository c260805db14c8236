"""`program_test_utils` calls a main as its binary would, and cleans up."""

import subprocess
import sys

from absl import flags
import pytest

from tff_fedrec.programs import execution
from tff_fedrec.programs import program_test_utils

_VALUE = flags.DEFINE_integer(
    'program_test_utils_test_value', 0, 'Read by the programs below.'
)


def _raw_value():
  """The flag's value, readable even while the flags are unparsed."""
  return flags.FLAGS['program_test_utils_test_value'].value


def _echo(argv):
  print(f'{argv[0]} value {_VALUE.value}')
  print('a warning', file=sys.stderr)


def _refuse(argv):
  del argv
  print('error: no', file=sys.stderr)
  sys.exit(2)


def test_run_main_parses_the_flags_returns_stdout_and_resets_them():
  stdout = program_test_utils.run_main(
      'echo', _echo, ['--program_test_utils_test_value=7']
  )
  assert stdout == 'echo value 7\n'
  assert not flags.FLAGS.is_parsed()
  assert _raw_value() == 0


def test_a_refusal_gives_its_status_and_stderr():
  assert program_test_utils.exit_status_and_stderr('refuse', _refuse, []) == (
      2, 'error: no\n'
  )
  with pytest.raises(AssertionError, match='returned instead of exiting'):
    program_test_utils.exit_status_and_stderr('echo', _echo, [])


def test_run_main_fails_the_test_when_the_program_exits():
  with pytest.raises(pytest.fail.Exception, match='status 2:\nerror: no'):
    program_test_utils.run_main('refuse', _refuse, [])


def test_a_failed_parse_leaves_no_value_behind():
  with pytest.raises(flags.Error):
    program_test_utils.run_main(
        'echo', _echo, ['--program_test_utils_test_value=5', '--nosuchflag=1']
    )
  assert _raw_value() == 0


def test_an_uncaught_error_passes_on_what_the_program_wrote(capsys):
  def crash(argv):
    del argv
    print('half done')
    raise RuntimeError('boom')

  with pytest.raises(RuntimeError, match='boom'):
    program_test_utils.run_main('crash', crash, [])
  assert capsys.readouterr().out == 'half done\n'


def test_a_program_that_leaves_its_worker_running_fails_the_test():
  started = []

  def leak(argv):
    del argv
    started.append(subprocess.Popen([execution.worker_binary_path(),
                                     '--port=0'],
                                    stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL))

  try:
    with pytest.raises(AssertionError, match='leak left its TFF worker'):
      program_test_utils.run_main('leak', leak, [])
  finally:
    for process in started:
      process.kill()
      process.wait()


def test_figures_close_compare_nested_figures_and_their_keys():
  figures = {'hr@10': 0.5, 'per_tier': {'small': {'hr@10': 0.25, 'users': 3}}}
  program_test_utils.assert_figures_close(
      figures, {'hr@10': 0.5 + 1e-8,
                'per_tier': {'small': {'hr@10': 0.25, 'users': 3}}})
  for other in ({'hr@10': 0.5, 'per_tier': {'small': {'hr@10': 0.26,
                                                       'users': 3}}},
                {'hr@10': 0.5, 'per_tier': {}}):
    with pytest.raises(AssertionError):
      program_test_utils.assert_figures_close(figures, other)
