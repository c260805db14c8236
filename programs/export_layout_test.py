import os
import urllib.parse

import pytest

from tff_fedrec.programs import export_layout

# Ids a data file can hold, each a trap for a naive folder name: a path
# out of the folder, the folder's parent, Windows' device and drive names,
# hidden files, ids equal up to case or up to an escape, unicode (composed
# and decomposed, which macOS treats as one name), control characters, and
# long ids sharing their first 300 characters.
_IDS = [
    'x/../../../escaped', '..', '.', '.hidden', '/', '\\', 'C:\\x', 'CON',
    'u0', 'U0', 'A', 'a', '%41', '%2541', 'a b', ' a', 'a ', 'tab\tnew\nline',
    'nul\x00', 'Ünï cödé', 'U\u0308', '\u00dc', '用户', '🙂', '~',
    'a~b', 'a' * 119, 'a' * 120, 'a' * 121, 'a' * 300, 'a' * 300 + 'b',
    'a' * 300 + 'c', '%' * 300, 'é' * 300,
]


def _names(ids):
  return [export_layout.model_folder(tier='single', user_id=i) for i in ids]


def test_names_are_safe_path_components(tmp_path):
  for name in _names(_IDS):
    assert name.isascii() and name.startswith('user_'), name
    assert len(name) <= 125
    assert not set(name) & set('/\\:*?"<>| \t\n\x00.'), name
  # Each is a folder of its own on a real file system.
  for name in _names(_IDS):
    (tmp_path / name).mkdir()
  assert sorted(os.listdir(tmp_path)) == sorted(_names(_IDS))


def test_different_ids_never_share_a_name_even_up_to_case():
  names = _names(_IDS)
  assert len({name.lower() for name in names}) == len(_IDS)


def test_short_names_decode_back_to_the_id():
  for user_id, name in zip(_IDS, _names(_IDS)):
    if '~' not in name:
      assert urllib.parse.unquote(name.removeprefix('user_')) == user_id


def test_long_ids_keep_a_readable_head_and_a_hash():
  short, long = _names(['a' * 120, 'a' * 121])
  assert short == 'user_' + 'a' * 120
  assert long.startswith('user_' + 'a' * 80 + '~')
  assert len(long) == len('user_') + 80 + 1 + 32
  # The head is cut before an escape it would split: 'é' is %C3%A9, and
  # 80 characters hold 26 escapes and 2 characters of the 27th.
  accented = export_layout.encoded_name('é' * 300)
  assert accented.split('~')[0] == '%C3%A9' * 13


def test_tier_folders_keep_their_names():
  for tier in ('small', 'medium', 'large', 'single'):
    assert export_layout.model_folder(tier=tier, user_id=None) == f'tier_{tier}'


def _make(root, paths):
  for path in paths:
    full = root / path
    if path.endswith('/'):
      full.mkdir(parents=True)
    else:
      full.parent.mkdir(parents=True, exist_ok=True)
      full.write_bytes(b'x')


_EXPORT = [
    'manifest.json', 'item_ids.json', 'export_report.json',
    'tier_single/float32.tflite', 'user_u0/float16.tflite',
    'user_u0/.float32.tflite.abc123.tmp', '.manifest.json.x1.tmp',
]


def test_an_export_or_an_empty_folder_has_nothing_foreign(tmp_path):
  assert export_layout.foreign_entries(tmp_path) == []
  _make(tmp_path, _EXPORT)
  assert export_layout.foreign_entries(tmp_path) == []


@pytest.mark.parametrize('extra, foreign', [
    (['run.flags'], ['run.flags']),
    (['checkpoints/program_state_2/0.npy'], ['checkpoints/']),
    (['user_notes.txt'], ['user_notes.txt']),
    (['user_u0/notes.txt'], ['user_u0/notes.txt']),
    (['tier_single/old/'], ['tier_single/old/']),
    (['manifest.json.bak'], ['manifest.json.bak']),
])
def test_anything_an_export_does_not_write_is_foreign(tmp_path, extra,
                                                      foreign):
  _make(tmp_path, [*_EXPORT, *extra])
  assert export_layout.foreign_entries(tmp_path) == foreign
