import os

import pytest

from tff_fedrec import atomic_files


def test_writes_text_and_bytes_and_replaces_the_old_file(tmp_path):
  path = tmp_path / 'deep' / 'summary.json'
  atomic_files.write_atomically(path, 'old')
  atomic_files.write_atomically(str(path), b'\x00new')
  assert path.read_bytes() == b'\x00new'
  assert os.listdir(path.parent) == ['summary.json']  # No temporary left.


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(
    tmp_path, monkeypatch
):
  path = tmp_path / 'run.flags'
  atomic_files.write_atomically(path, '--rounds=5\n')

  def fail(*args):
    raise OSError('disk full')

  monkeypatch.setattr(os, 'fsync', fail)
  with pytest.raises(OSError, match='disk full'):
    atomic_files.write_atomically(path, '--rounds=6\n')
  assert path.read_text() == '--rounds=5\n'
  assert os.listdir(tmp_path) == ['run.flags']


@pytest.mark.parametrize('umask, mode', [(0o022, 0o644), (0o077, 0o600),
                                         (0o002, 0o664)])
def test_the_file_gets_the_mode_the_umask_gives(tmp_path, umask, mode):
  previous = os.umask(umask)
  try:
    assert atomic_files.current_umask() == umask
    path = tmp_path / 'summary.json'
    atomic_files.write_atomically(path, '{}')
    with open(tmp_path / 'by_open', 'w'):
      pass
  finally:
    os.umask(previous)
  assert os.stat(path).st_mode & 0o777 == mode
  assert os.stat(tmp_path / 'by_open').st_mode & 0o777 == mode
