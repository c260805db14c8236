import os
import stat

import pytest

from tff_fedrec import atomic_files
from tff_fedrec.programs import export_directory


def _tree(root) -> dict:
  """{relative path: bytes, or None for a folder} of everything under
  `root`."""
  tree = {}
  for folder, folders, names in os.walk(root):
    for name in folders:
      tree[os.path.relpath(os.path.join(folder, name), root)] = None
    for name in names:
      path = os.path.join(folder, name)
      with open(path, 'rb') as f:
        tree[os.path.relpath(path, root)] = f.read()
  return tree


def _export(destination, files):
  with export_directory.replaced(destination) as staging:
    for path, data in files.items():
      atomic_files.write_atomically(staging / path, data)


def _earlier(tmp_path):
  destination = tmp_path / 'tflite'
  _export(destination, {'manifest.json': b'old', 'user_a/float32.tflite': b'1'})
  return destination, _tree(destination)


def test_a_new_export_replaces_the_earlier_one_whole(tmp_path):
  destination, _ = _earlier(tmp_path)
  _export(destination, {'manifest.json': b'new', 'tier_single/f.tflite': b'2'})
  assert _tree(destination) == {
      'manifest.json': b'new', 'tier_single': None,
      'tier_single/f.tflite': b'2',
  }
  assert os.listdir(tmp_path) == ['tflite']  # Nothing left beside it.


def test_a_failing_export_leaves_the_earlier_one_as_it_was(tmp_path):
  destination, before = _earlier(tmp_path)
  with pytest.raises(FileExistsError):
    with export_directory.replaced(destination) as staging:
      atomic_files.write_atomically(staging / 'manifest.json', b'half')
      # A file where the next file's folder must go: a real OS error.
      atomic_files.write_atomically(staging / 'user_a', b'')
      atomic_files.write_atomically(staging / 'user_a' / 'f.tflite', b'3')
  assert _tree(destination) == before
  assert os.listdir(tmp_path) == ['tflite']


def test_leftovers_of_killed_exports_are_deleted_by_the_next(tmp_path):
  destination, before = _earlier(tmp_path)
  # What a kill leaves: an unfinished staging folder, holding a manifest
  # too, and an earlier export cut short while being deleted.
  for name in ('.tflite.staging-0123456789abcdef.tmp',
               '.tflite.trash-fedcba9876543210.tmp'):
    (tmp_path / name / 'user_b').mkdir(parents=True)
    (tmp_path / name / 'manifest.json').write_bytes(b'partial')
  # Neither is another folder's, nor a folder a user named alike.
  others = ['.tflite2.staging-0123456789abcdef.tmp', 'tflite.staging-x',
            '.tflite.staging-0.previous-0123456789abcdef.tmp']
  for name in others:
    (tmp_path / name).mkdir()
  with pytest.raises(RuntimeError):  # Cleaning comes first.
    with export_directory.replaced(destination):
      raise RuntimeError('stop')
  assert sorted(os.listdir(tmp_path)) == sorted(['tflite', *others])
  assert _tree(destination) == before


def test_an_export_moved_aside_by_a_kill_is_renamed_back(tmp_path):
  destination, before = _earlier(tmp_path)
  # A kill between the swap's first two renames: no destination, the
  # earlier export whole beside it.
  os.rename(destination, tmp_path / '.tflite.previous-0123456789abcdef.tmp')
  with pytest.raises(RuntimeError):
    with export_directory.replaced(destination):
      raise RuntimeError('stop')
  assert _tree(destination) == before
  assert os.listdir(tmp_path) == ['tflite']


def test_the_staging_folder_of_an_export_still_running_is_kept(tmp_path):
  destination = tmp_path / 'tflite'
  with export_directory.replaced(destination) as running:
    atomic_files.write_atomically(running / 'manifest.json', b'first')
    # A second export cleans leftovers, but not the running one's.
    _export(destination, {'manifest.json': b'second'})
    assert running.is_dir()
    assert (destination / 'manifest.json').read_bytes() == b'second'
  assert (destination / 'manifest.json').read_bytes() == b'first'
  assert os.listdir(tmp_path) == ['tflite']


def test_a_symlinked_destination_stays_a_symlink(tmp_path):
  (tmp_path / 'served').mkdir()
  os.symlink('served', tmp_path / 'tflite')
  _export(tmp_path / 'tflite', {'manifest.json': b'new'})
  assert os.readlink(tmp_path / 'tflite') == 'served'
  assert _tree(tmp_path / 'served') == {'manifest.json': b'new'}


@pytest.mark.parametrize('umask, file_mode, folder_mode', [
    (0o022, 0o644, 0o755),
    (0o027, 0o640, 0o750),
    (0o077, 0o600, 0o700),
])
def test_files_and_folders_follow_the_umask(tmp_path, umask, file_mode,
                                            folder_mode):
  destination = tmp_path / 'shared' / 'tflite'
  old_umask = os.umask(umask)
  try:
    _export(destination, {'manifest.json': b'{}', 'user_a/f.tflite': b'1'})
  finally:
    os.umask(old_umask)
  modes = {
      path: stat.S_IMODE(os.stat(os.path.join(destination, path)).st_mode)
      for path in _tree(destination)
  }
  assert modes == {'manifest.json': file_mode, 'user_a': folder_mode,
                   'user_a/f.tflite': file_mode}
  for folder in (destination, destination.parent):
    assert stat.S_IMODE(os.stat(folder).st_mode) == folder_mode
