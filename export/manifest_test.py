"""Tests of the export manifest: round trip, atomic writes, verification."""

import hashlib
import json
import os

import pytest

from tff_fedrec.export import manifest

_FIELDS = {
    'method': 'hetefedrec',
    'tier': 'medium',
    'user': None,
    'embedding_dim': 16,
    'quantization': 'dynamic_range',
}


def _write_two_models(root):
  return [
      manifest.write_model_file(
          root,
          'hetefedrec/medium/dynamic_range.tflite',
          b'tier model',
          **_FIELDS,
      ),
      manifest.write_model_file(
          root,
          'pfedrec/single/user_3/float32.tflite',
          b'personal model',
          method='pfedrec',
          tier='single',
          user='3',
          embedding_dim=32,
          quantization='float32',
      ),
  ]


def test_entry_records_size_and_sha256():
  entry = manifest.entry_for_bytes('a.tflite', b'abc', **_FIELDS)

  assert entry.size_bytes == 3
  # SHA-256("abc"), the FIPS 180-2 test vector.
  assert entry.sha256 == (
      'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad'
  )


def test_manifest_round_trips(tmp_path):
  entries = _write_two_models(tmp_path)

  path = manifest.write_manifest(tmp_path, entries)

  assert path == tmp_path / 'manifest.json'
  assert manifest.read_manifest(tmp_path) == entries
  document = json.loads(path.read_text())
  assert document['format_version'] == 1
  assert document['models'][1] == {
      'path': 'pfedrec/single/user_3/float32.tflite',
      'method': 'pfedrec',
      'tier': 'single',
      'user': '3',
      'embedding_dim': 32,
      'quantization': 'float32',
      'size_bytes': len(b'personal model'),
      'sha256': hashlib.sha256(b'personal model').hexdigest(),
  }
  assert (tmp_path / 'hetefedrec/medium/dynamic_range.tflite').read_bytes() == (
      b'tier model'
  )


def test_writes_leave_no_temporary_files(tmp_path):
  entries = _write_two_models(tmp_path)
  manifest.write_manifest(tmp_path, entries)
  manifest.write_manifest(tmp_path, entries[:1])

  names = sorted(
      os.path.relpath(os.path.join(folder, name), tmp_path)
      for folder, _, files in os.walk(tmp_path)
      for name in files
  )

  assert names == [
      'hetefedrec/medium/dynamic_range.tflite',
      'manifest.json',
      'pfedrec/single/user_3/float32.tflite',
  ]
  assert manifest.read_manifest(tmp_path) == entries[:1]


def test_a_failed_write_keeps_the_old_manifest(tmp_path):
  entries = _write_two_models(tmp_path)
  manifest.write_manifest(tmp_path, entries)

  with pytest.raises(manifest.ManifestError, match='repeat a path'):
    manifest.write_manifest(tmp_path, [entries[0], entries[0]])

  assert manifest.read_manifest(tmp_path) == entries


def test_detects_a_corrupted_file(tmp_path):
  manifest.write_manifest(tmp_path, _write_two_models(tmp_path))
  corrupted = tmp_path / 'pfedrec/single/user_3/float32.tflite'
  data = bytearray(corrupted.read_bytes())
  data[0] ^= 1
  corrupted.write_bytes(data)

  with pytest.raises(manifest.ManifestError, match='float32.tflite: SHA-256'):
    manifest.read_manifest(tmp_path)
  # Without verification the manifest itself still reads.
  assert len(manifest.read_manifest(tmp_path, verify=False)) == 2


def test_detects_a_truncated_file(tmp_path):
  manifest.write_manifest(tmp_path, _write_two_models(tmp_path))
  (tmp_path / 'hetefedrec/medium/dynamic_range.tflite').write_bytes(b'tier')

  with pytest.raises(
      manifest.ManifestError, match='4 bytes, the manifest says 10'
  ):
    manifest.read_manifest(tmp_path)


def test_detects_a_missing_file(tmp_path):
  manifest.write_manifest(tmp_path, _write_two_models(tmp_path))
  os.remove(tmp_path / 'hetefedrec/medium/dynamic_range.tflite')

  with pytest.raises(
      manifest.ManifestError, match='dynamic_range.tflite: .*missing'
  ):
    manifest.read_manifest(tmp_path)


def test_missing_manifest_is_a_clear_error(tmp_path):
  with pytest.raises(manifest.ManifestError, match='No manifest at'):
    manifest.read_manifest(tmp_path)


@pytest.mark.parametrize(
    'document,message',
    [
        ('{"models": []', 'not JSON'),
        ('{"format_version": 2, "models": []}', 'format_version 2'),
        (
            '{"format_version": 1, "models": [{"path": "a.tflite"}]}',
            'an entry has fields',
        ),
    ],
)
def test_malformed_manifest_is_a_clear_error(tmp_path, document, message):
  (tmp_path / 'manifest.json').write_text(document)

  with pytest.raises(manifest.ManifestError, match=message):
    manifest.read_manifest(tmp_path)


@pytest.mark.parametrize(
    'path,changes,message',
    [
        ('/abs/a.tflite', {}, 'path must be relative'),
        ('../a.tflite', {}, 'path must be relative'),
        ('', {}, 'path must be relative'),
        ('a.tflite', {'tier': 'huge'}, "tier must be one of .*'single'"),
        ('a.tflite', {'quantization': 'int4'}, 'quantization must be one of'),
        ('a.tflite', {'user': 3}, 'user must be a user id'),
        ('a.tflite', {'user': ''}, 'user must be a user id'),
        ('a.tflite', {'embedding_dim': 0}, 'embedding_dim positive'),
        ('a.tflite', {'method': ''}, 'method must be non-empty'),
    ],
)
def test_rejects_invalid_entries(path, changes, message):
  with pytest.raises(manifest.ManifestError, match=message):
    manifest.entry_for_bytes(path, b'x', **{**_FIELDS, **changes})
