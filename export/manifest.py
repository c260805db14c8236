"""The manifest of an export directory: one JSON entry per TFLite file.

A phone (or the server handing files out) finds the file for a method, tier,
user and quantization in the manifest and checks it arrived whole with the
size and SHA-256 recorded here.

File layout of `manifest.json`:

  {"format_version": 1,
   "models": [{"path": "fedmf/single/user_7/float16.tflite",
               "method": "fedmf", "tier": "single", "user": "7",
               "embedding_dim": 32, "quantization": "float16",
               "size_bytes": 25016, "sha256": "<64 hex digits>"}, ...]}

`path` is relative to the manifest's directory and uses '/'. `tier` is one
of HeteFedRec's tiers (`tff_fedrec.tiers.TIER_NAMES`), of RF²'s device
tiers (`tff_fedrec.device_tiers.TIER_NAMES`), or 'single' for a method with
one model size; `user` is the user id (as in the data set) of a
personal model and
null for a tier's global model, which takes the user vector as input.

Both the model files (`write_model_file`) and the manifest (`write_manifest`)
are written to a temporary file in the target directory and moved into place
with `os.replace`, so a reader sees the old file or the new one, never a
partial one. The export program writes a whole export this way into a
staging folder and swaps the folder into place
(`programs/export_directory.py`), so that files and manifest always belong
to one export; a user's folder name encodes its id
(`programs/export_layout.py`), and `user` here is the id itself.

Example:
  >>> import tempfile
  >>> root = tempfile.mkdtemp()
  >>> entry = write_model_file(root, 'pfedrec/single/user_3/float32.tflite',
  ...     b'model bytes', method='pfedrec', tier='single', user='3',
  ...     embedding_dim=32, quantization='float32')
  >>> _ = write_manifest(root, [entry])
  >>> read_manifest(root) == [entry]
  True
"""

from collections.abc import Sequence
import dataclasses
import hashlib
import json
import os
import pathlib

from tff_fedrec import atomic_files
from tff_fedrec import device_tiers
from tff_fedrec import tiers
from tff_fedrec.export import tflite_conversion

MANIFEST_NAME = 'manifest.json'
FORMAT_VERSION = 1
SINGLE_TIER = 'single'
TIERS = (*tiers.TIER_NAMES, *device_tiers.TIER_NAMES, SINGLE_TIER)


class ManifestError(ValueError):
  """A manifest that is malformed or disagrees with the files it lists."""


@dataclasses.dataclass(frozen=True)
class ManifestEntry:
  """One exported model file (fields as in the module docstring)."""

  path: str
  method: str
  tier: str
  user: str | None
  embedding_dim: int
  quantization: str
  size_bytes: int
  sha256: str

  def __post_init__(self):
    parts = pathlib.PurePosixPath(self.path).parts
    if (
        not parts
        or pathlib.PurePosixPath(self.path).is_absolute()
        or '..' in parts
        or '\\' in self.path
    ):
      raise ManifestError(
          f'path must be relative, "/"-separated and inside the export '
          f'directory; got {self.path!r}.'
      )
    if self.tier not in TIERS:
      raise ManifestError(f'tier must be one of {TIERS}; got {self.tier!r}.')
    if self.quantization not in tflite_conversion.QUANTIZATIONS:
      raise ManifestError(
          f'quantization must be one of {tflite_conversion.QUANTIZATIONS}; '
          f'got {self.quantization!r}.'
      )
    if self.user is not None and (
        not isinstance(self.user, str) or not self.user
    ):
      raise ManifestError(
          f'user must be a user id (a non-empty string) or None; got '
          f'{self.user!r}.'
      )
    if not self.method or self.embedding_dim < 1 or self.size_bytes < 0:
      raise ManifestError(
          'method must be non-empty, embedding_dim positive and size_bytes '
          f'non-negative; got {self.method!r}, {self.embedding_dim}, '
          f'{self.size_bytes}.'
      )


def sha256_hex(data: bytes) -> str:
  """The SHA-256 digest of `data`, 64 lowercase hex digits."""
  return hashlib.sha256(data).hexdigest()


def entry_for_bytes(
    path: str,
    model_bytes: bytes,
    *,
    method: str,
    tier: str,
    user: str | None,
    embedding_dim: int,
    quantization: str,
) -> ManifestEntry:
  """The entry of a file at `path` (relative) holding `model_bytes`."""
  return ManifestEntry(
      path=path,
      method=method,
      tier=tier,
      user=user,
      embedding_dim=embedding_dim,
      quantization=quantization,
      size_bytes=len(model_bytes),
      sha256=sha256_hex(model_bytes),
  )


def write_model_file(
    root: str | os.PathLike, path: str, model_bytes: bytes, **fields
) -> ManifestEntry:
  """Writes `model_bytes` to root/path atomically and returns its entry.

  Args:
    root: The export directory, where the manifest will be.
    path: The file's path relative to `root`, '/'-separated.
    model_bytes: The TFLite flatbuffer.
    **fields: method, tier, user, embedding_dim, quantization, as for
      `entry_for_bytes`.
  """
  entry = entry_for_bytes(path, model_bytes, **fields)
  atomic_files.write_atomically(pathlib.Path(root, entry.path), model_bytes)
  return entry


def write_manifest(
    root: str | os.PathLike, entries: Sequence[ManifestEntry]
) -> pathlib.Path:
  """Writes root/manifest.json listing `entries` atomically; returns its
  path. Raises `ManifestError` if two entries name the same path."""
  paths = [entry.path for entry in entries]
  if len(set(paths)) != len(paths):
    raise ManifestError(f'Entries repeat a path: {sorted(paths)}.')
  document = {
      'format_version': FORMAT_VERSION,
      'models': [dataclasses.asdict(entry) for entry in entries],
  }
  target = pathlib.Path(root, MANIFEST_NAME)
  atomic_files.write_atomically(
      target, (json.dumps(document, indent=2) + '\n').encode('utf-8')
  )
  return target


def read_manifest(
    root: str | os.PathLike, *, verify: bool = True
) -> list[ManifestEntry]:
  """The entries of root/manifest.json, in their written order.

  Args:
    root: The export directory.
    verify: Also check that every listed file exists and has the recorded
      size and SHA-256.

  Raises:
    ManifestError: The manifest is malformed, or (with `verify`) a file is
      missing or its size or checksum differs.
  """
  manifest_path = pathlib.Path(root, MANIFEST_NAME)
  try:
    document = json.loads(manifest_path.read_text(encoding='utf-8'))
  except FileNotFoundError as error:
    raise ManifestError(f'No manifest at {manifest_path}.') from error
  except json.JSONDecodeError as error:
    raise ManifestError(f'{manifest_path} is not JSON: {error}.') from error
  if document.get('format_version') != FORMAT_VERSION:
    raise ManifestError(
        f'{manifest_path} has format_version '
        f'{document.get("format_version")!r}; expected {FORMAT_VERSION}.'
    )
  field_names = {field.name for field in dataclasses.fields(ManifestEntry)}
  entries = []
  for record in document.get('models', []):
    if set(record) != field_names:
      raise ManifestError(
          f'{manifest_path}: an entry has fields {sorted(record)}; expected '
          f'{sorted(field_names)}.'
      )
    entries.append(ManifestEntry(**record))
  if verify:
    for entry in entries:
      _verify_file(pathlib.Path(root), entry)
  return entries


def _verify_file(root: pathlib.Path, entry: ManifestEntry) -> None:
  file_path = root / entry.path
  try:
    data = file_path.read_bytes()
  except FileNotFoundError as error:
    raise ManifestError(
        f'{entry.path}: listed in the manifest but missing from {root}.'
    ) from error
  if len(data) != entry.size_bytes:
    raise ManifestError(
        f'{entry.path}: {len(data)} bytes, the manifest says '
        f'{entry.size_bytes}.'
    )
  digest = sha256_hex(data)
  if digest != entry.sha256:
    raise ManifestError(
        f'{entry.path}: SHA-256 {digest}, the manifest says {entry.sha256}.'
    )
