"""Tests of MovieLens fetching.

The tests marked "real fetch" run pip against the package registry. The
ml-100k fetch goes to the default cache (`$TFF_FEDREC_CACHE` or
~/.cache/tff_fedrec), so a machine downloads the wheel once; the others use
pip's own cache after that.
"""

import dataclasses
import hashlib
import subprocess

import pytest

from tff_fedrec.tasks import errors
from tff_fedrec.tasks import movielens


def _fail_if_called(*args, **kwargs):
  pytest.fail('pip was run although the data was available locally.')


@pytest.fixture(scope='module')
def ml100k_path():
  """Real fetch: ml-100k in the default cache directory."""
  return movielens.fetch_movielens(
      'ml-100k', cache_dir=movielens.default_cache_dir()
  )


def test_real_fetch_of_ml100k_matches_the_published_counts(ml100k_path):
  source = movielens.MOVIELENS_SOURCES['ml-100k']
  assert ml100k_path == movielens.default_cache_dir() / 'ml-100k.inter'
  assert hashlib.sha256(ml100k_path.read_bytes()).hexdigest() == source.sha256

  frame = movielens.load_movielens('ml-100k')

  # Harper & Konstan 2015: 100,000 ratings by 943 users of 1,682 movies.
  published = (source.num_rows, source.num_users, source.num_items)
  assert published == (100_000, 943, 1_682)
  assert len(frame) == 100_000
  assert frame['user'].nunique() == 943
  assert frame['item'].nunique() == 1_682
  assert frame.iloc[0].tolist() == ['196', '242', 3.0, 881250949.0]


def test_valid_cache_is_used_without_running_pip(
    ml100k_path, tmp_path, monkeypatch
):
  cached = tmp_path / 'ml-100k.inter'
  cached.write_bytes(ml100k_path.read_bytes())
  monkeypatch.setattr(subprocess, 'run', _fail_if_called)

  assert movielens.fetch_movielens('ml-100k', cache_dir=tmp_path) == cached


def test_corrupted_cache_is_detected_and_fetched_again(ml100k_path, tmp_path):
  cached = tmp_path / 'ml-100k.inter'
  good = ml100k_path.read_bytes()
  # One flipped rating: same size, different content.
  cached.write_bytes(good.replace(b'196\t242\t3\t', b'196\t242\t4\t', 1))

  path = movielens.fetch_movielens('ml-100k', cache_dir=tmp_path)

  assert path == cached
  assert cached.read_bytes() == good
  assert [p.name for p in tmp_path.iterdir()] == ['ml-100k.inter']


def test_failed_download_raises_fetch_error_naming_the_fix(
    tmp_path, monkeypatch
):
  source = movielens.MOVIELENS_SOURCES['ml-100k']
  monkeypatch.setitem(
      movielens.MOVIELENS_SOURCES,
      'ml-100k',
      dataclasses.replace(source, version='0.0.0.dev0'),
  )

  with pytest.raises(errors.DatasetFetchError) as raised:
    movielens.fetch_movielens('ml-100k', cache_dir=tmp_path)

  message = str(raised.value)
  assert 'recbole==0.0.0.dev0' in message
  assert '--data_path=' in message
  assert list(tmp_path.iterdir()) == []


def test_checksum_mismatch_raises_fetch_error_with_both_hashes(
    tmp_path, monkeypatch
):
  source = movielens.MOVIELENS_SOURCES['ml-100k']
  monkeypatch.setitem(
      movielens.MOVIELENS_SOURCES,
      'ml-100k',
      dataclasses.replace(source, sha256='0' * 64),
  )

  with pytest.raises(errors.DatasetFetchError) as raised:
    movielens.fetch_movielens('ml-100k', cache_dir=tmp_path)

  message = str(raised.value)
  assert source.sha256 in message and '0' * 64 in message
  assert '--data_path=' in message
  assert list(tmp_path.iterdir()) == []


def test_missing_member_raises_fetch_error(tmp_path, monkeypatch):
  source = movielens.MOVIELENS_SOURCES['ml-100k']
  monkeypatch.setitem(
      movielens.MOVIELENS_SOURCES,
      'ml-100k',
      dataclasses.replace(source, member='recbole/no-such-file.inter'),
  )

  with pytest.raises(
      errors.DatasetFetchError, match='has no member recbole/no-such-file.inter'
  ):
    movielens.fetch_movielens('ml-100k', cache_dir=tmp_path)


def test_data_path_is_loaded_without_fetching(tmp_path, monkeypatch):
  local = tmp_path / 'my-ml-100k.inter'
  local.write_text(
      'user_id:token\titem_id:token\trating:float\t'
      'timestamp:float\n196\t242\t3\t881250949\n'
  )
  monkeypatch.setattr(subprocess, 'run', _fail_if_called)

  frame = movielens.load_movielens('ml-100k', data_path=local)

  assert frame.iloc[0].tolist() == ['196', '242', 3.0, 881250949.0]


def test_unknown_name_lists_the_known_ones():
  with pytest.raises(ValueError, match='ml-100k, ml-1m'):
    movielens.load_movielens('ml-20m')


def test_default_cache_dir_honours_the_environment(tmp_path, monkeypatch):
  monkeypatch.setenv('TFF_FEDREC_CACHE', str(tmp_path))
  assert movielens.default_cache_dir() == tmp_path

  monkeypatch.delenv('TFF_FEDREC_CACHE')
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))
  assert movielens.default_cache_dir() == (
      tmp_path / 'home' / '.cache' / 'tff_fedrec'
  )


def test_real_fetch_of_the_movies_gives_every_movie_its_genres():
  # Real fetch (the same wheel as the interactions): RecBole's ml-100k.item.
  genres = movielens.load_movie_genres('ml-100k')
  frame = movielens.load_movielens('ml-100k')
  assert len(genres) == movielens.MOVIELENS_ITEM_SOURCES['ml-100k'].num_items
  assert set(frame['item']) <= set(genres)
  assert genres['1'] == ('Animation', "Children's", 'Comedy')  # Toy Story.
  cached = movielens.default_cache_dir() / 'ml-100k.item'
  assert hashlib.sha256(cached.read_bytes()).hexdigest() == (
      movielens.MOVIELENS_ITEM_SOURCES['ml-100k'].sha256)

