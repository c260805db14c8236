"""Whole-file writes that a crash or a kill never leaves half-written.

`write_atomically(path, data)` writes `data` to a temporary file beside
`path`, flushes it to disk and renames it over `path` with `os.replace`, so
a reader (or a resumed run) sees the old file or the new one, never a
mixture. The run's summary, its flags, the export report, the manifest and
the exported models all go through it.

  >>> import json, pathlib, tempfile
  >>> root = pathlib.Path(tempfile.mkdtemp())
  >>> write_atomically(root / 'a' / 'summary.json', json.dumps({'round': 3}))
  >>> (root / 'a' / 'summary.json').read_text()
  '{"round": 3}'
"""

import os
import pathlib
import tempfile
from typing import Union


def current_umask() -> int:
  """The process's umask, read without changing it (Linux reports it in
  /proc; elsewhere it is set and restored at once)."""
  try:
    with open('/proc/self/status') as status:
      for line in status:
        if line.startswith('Umask:'):
          return int(line.split()[1], 8)
  except OSError:
    pass
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def write_atomically(path: Union[str, os.PathLike], data: Union[str, bytes]
                     ) -> None:
  """Replaces `path` with `data` (str is written as UTF-8) atomically,
  creating its directory if needed, with the mode a new file gets under
  the umask (0644 under 022); on any failure `path` is untouched and the
  temporary file is removed."""
  target = pathlib.Path(path)
  target.parent.mkdir(parents=True, exist_ok=True)
  if isinstance(data, str):
    data = data.encode('utf-8')
  # The temporary file sits beside the target: os.replace is atomic only
  # within one file system.
  handle, temporary = tempfile.mkstemp(
      dir=target.parent, prefix=f'.{target.name}.', suffix='.tmp'
  )
  try:
    # mkstemp makes the file 0600; the result is a file the user shares
    # (a summary, an export), so it gets the mode `open` would give it.
    os.fchmod(handle, 0o666 & ~current_umask())
    with os.fdopen(handle, 'wb') as file:
      file.write(data)
      file.flush()
      os.fsync(file.fileno())
    os.replace(temporary, target)
  except BaseException:
    os.unlink(temporary)
    raise
