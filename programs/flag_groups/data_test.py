"""--separator's escapes, and the messages of the data group's bad values."""

from absl import flags
import pytest

from tff_fedrec.programs.flag_groups import data
from tff_fedrec.programs.flag_groups import group


def _separator(value):
  try:
    flags.FLAGS(['train', f'--separator={value}'])
    return data.separator()
  finally:
    flags.FLAGS.unparse_flags()


@pytest.mark.parametrize('given, expected', [
    (',', ','), ('::', '::'), (r'\t', '\t'), (r'\x1f', '\x1f'),
    ('\\\\', '\\'),
    # Non-ASCII separators stay themselves (decoding the UTF-8 bytes as
    # escapes gave 'Â¦' for '¦').
    ('¦', '¦'), ('€', '€'), ('ä;', 'ä;'),
])
def test_separator_resolves_escapes_and_keeps_other_characters(
    given, expected):
  assert _separator(given) == expected


def test_a_broken_escape_names_the_flag_and_the_fix():
  with pytest.raises(group.FlagError) as error:
    _separator('\\x')
  message = str(error.value)
  assert message.startswith("--separator='\\x' is not a valid escape")
  assert '--separator="\\t"' in message
