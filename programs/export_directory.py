"""Writing an export folder as one transaction: the earlier export stays
whole until the new one is complete and checked.

`replaced(destination)` yields a fresh, empty staging folder beside
`destination` (the same parent, so the same file system). When the block
ends, the staging folder becomes `destination`; when it raises (an error,
a full disk, Ctrl-C), the staging folder is deleted and `destination` is as
it was.

  >>> import pathlib, tempfile
  >>> parent = pathlib.Path(tempfile.mkdtemp())
  >>> with replaced(parent / 'tflite') as staging:
  ...   _ = (staging / 'manifest.json').write_text('{}')
  >>> [path.name for path in parent.iterdir()]
  ['tflite']

Beside a destination named D, all hidden and never read as an export,
and named as `atomic_files` names its temporary files (.<name>.<...>.tmp):

  .D.staging-<16 hex>.tmp    an export being written
  .D.previous-<16 hex>.tmp   the export being replaced, during the swap
  .D.trash-<16 hex>.tmp      the replaced export, being deleted

The swap renames D to .D.previous-X.tmp, the staging folder to D, and
.D.previous-X.tmp to .D.trash-X.tmp, which it then deletes. A rename within
one folder is atomic, so a reader of D sees the earlier export whole, then
for the instant between the first two renames no D at all
(FileNotFoundError: read again), then the new export whole; never files of
two exports in one folder. A reader that has read the earlier manifest and
opens its files afterwards may find them gone or replaced: checking each
file's size and SHA-256 against the manifest
(`manifest.read_manifest(verify=True)`) catches that, and reading again
gets the new export whole.

Not chosen: Linux's renameat2(RENAME_EXCHANGE) swaps two folders without
that instant, but Python has no binding for it and other systems no
equivalent. A symlink D -> .D.v<n>, replaced with `os.replace`, has no gap
either, but D would become a symlink, which copies, archives and file
servers treat unlike a folder, and an old version could be deleted only
once no reader holds it, which the exporter cannot know.

A process killed at any point (kill -9, power loss) leaves D whole, the
old export or the new, and maybe leftovers beside it, which the next
`replaced` of D cleans before it starts. A kill between the first two
renames leaves no D and a .D.previous-X.tmp: the earlier export, whole (it
only ever gets there by one rename), which is renamed back to D. Every
other leftover is deleted, but the staging folder of an export still
running: its process holds an flock on it, which the kernel drops when the
process dies, however it dies. A .D.previous-X.tmp is renamed to
.D.trash-X.tmp before it is deleted, so a deletion cut short never leaves
a partial export that could be renamed back.

Before the swap every file and folder in the staging folder is fsynced,
and the parent after it, so after a power loss D is one export, whole.

Modes: the staging folder is made with mode 0o777, which the user's umask
(or a default ACL of the parent) reduces (0o755 under umask 022; not the
0o700 of `tempfile.mkdtemp`), and it becomes D, so D keeps no mode of the
earlier export. Files keep the mode they were written with:
`atomic_files.write_atomically`, like `open`, gives 0o666 less the umask.
"""

import contextlib
import fcntl
import os
import pathlib
import re
import secrets
import shutil
from typing import Iterator

_STAGING, _PREVIOUS, _TRASH = 'staging', 'previous', 'trash'


def _sibling(destination: pathlib.Path, kind: str) -> pathlib.Path:
  return destination.with_name(
      f'.{destination.name}.{kind}-{secrets.token_hex(8)}.tmp'
  )


def _leftovers(destination: pathlib.Path, kind: str) -> list[pathlib.Path]:
  pattern = re.compile(
      rf'\.{re.escape(destination.name)}\.{kind}-[0-9a-f]{{16}}\.tmp'
  )
  return sorted(
      path for path in destination.parent.iterdir()
      if pattern.fullmatch(path.name)
  )


def _delete_unless_in_use(folder: pathlib.Path) -> None:
  try:
    descriptor = os.open(folder, os.O_RDONLY)
  except FileNotFoundError:
    return  # Another export cleaned it.
  try:
    try:
      fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      return  # An export being written.
    shutil.rmtree(folder, ignore_errors=True)
  finally:
    os.close(descriptor)


def _clean_leftovers(destination: pathlib.Path) -> None:
  """Restores an export a kill left moved aside and deletes the other
  leftovers beside `destination` (module docstring)."""
  previous = _leftovers(destination, _PREVIOUS)
  if previous and not os.path.lexists(destination):
    latest = max(previous, key=lambda path: path.stat().st_ctime)
    os.rename(latest, destination)
  for kind in (_STAGING, _PREVIOUS, _TRASH):
    for folder in _leftovers(destination, kind):
      _delete_unless_in_use(folder)


def _fsync(path: str) -> None:
  descriptor = os.open(path, os.O_RDONLY)
  try:
    os.fsync(descriptor)
  finally:
    os.close(descriptor)


def _sync(staging: pathlib.Path) -> None:
  """fsyncs every file and folder in `staging`."""
  for folder, _, names in os.walk(staging):
    for name in names:
      _fsync(os.path.join(folder, name))
    _fsync(folder)


def _swap_in(staging: pathlib.Path, destination: pathlib.Path) -> None:
  previous = None
  if os.path.lexists(destination):
    previous = _sibling(destination, _PREVIOUS)
    os.rename(destination, previous)
  try:
    os.rename(staging, destination)
  except BaseException:
    if previous is not None:
      # If this fails too, the next export renames it back.
      with contextlib.suppress(OSError):
        os.rename(previous, destination)
    raise
  # The new export is in place, so nothing here may raise (a raise means
  # "destination as it was"); an old export left behind is deleted by the
  # next one.
  with contextlib.suppress(OSError):
    _fsync(str(destination.parent))
  if previous is not None:
    with contextlib.suppress(OSError):
      trash = _sibling(destination, _TRASH)
      os.rename(previous, trash)
      shutil.rmtree(trash, ignore_errors=True)


@contextlib.contextmanager
def replaced(destination: str | os.PathLike) -> Iterator[pathlib.Path]:
  """Yields an empty staging folder that replaces `destination` (a folder
  or missing; a symlink's target is replaced) when the block ends, and is
  deleted when it raises (module docstring).

  Raises:
    OSError: The staging folder cannot be made or moved into place;
      `destination` is as it was.
  """
  destination = pathlib.Path(os.path.realpath(destination))
  destination.parent.mkdir(parents=True, exist_ok=True)
  _clean_leftovers(destination)
  staging = _sibling(destination, _STAGING)
  staging.mkdir(mode=0o777)
  descriptor = os.open(staging, os.O_RDONLY)
  try:
    try:
      fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
      yield staging
      _sync(staging)
      _swap_in(staging, destination)
    except BaseException:
      shutil.rmtree(staging, ignore_errors=True)
      raise
  finally:
    os.close(descriptor)
