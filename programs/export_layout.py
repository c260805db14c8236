"""The layout of an export folder (`python -m tff_fedrec.programs.export`).

  manifest.json                  every model file: tier, user id, path, ...
  item_ids.json                  the data set's item id of each model row
  export_report.json             the interpreter checks
  tier_<tier>/<q>.tflite         a tier's global model
  user_<encoded id>/<q>.tflite   a user's own model

A user id comes from a data file and can be any string: '/', '..', spaces,
unicode, hundreds of characters. Its folder name (`model_folder`) keeps
a-z, 0-9, '_' and '-' and percent-encodes every other UTF-8 byte as %XX with
upper-case hex digits, so the name is one path component, ASCII, and decodes
back to the id (`urllib.parse.unquote`). Two ids never share a name, not
even on a case-insensitive file system: an upper-case letter appears only
inside a %XX, whose position the '%' marks, so two names equal up to case
are equal. An encoding longer than 120 characters is cut to its first 80
(at a %XX boundary) and ended with '~' and 32 hex digits of the id's
SHA-256; '~' is itself encoded, so no short name has one, and long names
differ unless the hashes collide (1 in 2**128).

The name is for the file system only: the manifest keeps the id as it is in
the data, and a reader finds a user's file through the manifest (its `user`
and `path`), never by building the name.

  >>> model_folder(tier='single', user_id=None)
  'tier_single'
  >>> model_folder(tier='single', user_id='x/../escaped')
  'user_x%2F%2E%2E%2Fescaped'
  >>> model_folder(tier='single', user_id='U7')
  'user_%557'
"""

import hashlib
import os

from tff_fedrec.export import manifest

ITEM_IDS_NAME = 'item_ids.json'
REPORT_NAME = 'export_report.json'
_FILES = (manifest.MANIFEST_NAME, ITEM_IDS_NAME, REPORT_NAME)
_TIER_PREFIX, _USER_PREFIX = 'tier_', 'user_'
_MODEL_SUFFIX = '.tflite'

_LITERAL = frozenset('abcdefghijklmnopqrstuvwxyz0123456789_-')
_MAX_ENCODED = 120
_HASHED_HEAD = 80
_HASH_DIGITS = 32


def _percent_encoded(text: str) -> str:
  return ''.join(
      char if char in _LITERAL else ''.join(
          f'%{byte:02X}' for byte in char.encode('utf-8', 'surrogatepass')
      )
      for char in text
  )


def encoded_name(text: str) -> str:
  """`text` as one safe path component (module docstring), at most 120
  characters."""
  encoded = _percent_encoded(text)
  if len(encoded) <= _MAX_ENCODED:
    return encoded
  head = encoded[:_HASHED_HEAD]
  # Not ending inside a %XX keeps the head readable.
  escape = head.rfind('%', len(head) - 2)
  if escape >= 0:
    head = head[:escape]
  digest = hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()
  return f'{head}~{digest[:_HASH_DIGITS]}'


def model_folder(*, tier: str, user_id: str | None) -> str:
  """The folder of a tier's global model (`user_id` None) or of a user's
  own model, relative to the export folder."""
  if user_id is None:
    return _TIER_PREFIX + encoded_name(tier)
  return _USER_PREFIX + encoded_name(user_id)


def _is_temporary(name: str) -> bool:
  # What `atomic_files.write_atomically` leaves when it is killed.
  return name.startswith('.') and name.endswith('.tmp')


def foreign_entries(folder: str | os.PathLike) -> list[str]:
  """What in `folder` (an existing directory) an export does not write:
  empty for an earlier export or an empty folder. Paths are relative,
  folders end with '/'."""
  foreign = []
  for entry in sorted(os.scandir(folder), key=lambda entry: entry.name):
    if entry.is_dir(follow_symlinks=False) and entry.name.startswith(
        (_TIER_PREFIX, _USER_PREFIX)
    ):
      foreign += [
          f'{entry.name}/{inner.name}' + ('/' if inner.is_dir() else '')
          for inner in sorted(os.scandir(entry.path), key=lambda e: e.name)
          if not (inner.is_file(follow_symlinks=False) and (
              inner.name.endswith(_MODEL_SUFFIX) or _is_temporary(inner.name)
          ))
      ]
    elif not (entry.is_file(follow_symlinks=False) and (
        entry.name in _FILES or _is_temporary(entry.name)
    )):
      foreign.append(entry.name + ('/' if entry.is_dir() else ''))
  return foreign
