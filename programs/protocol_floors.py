"""A run's floors (`tasks.floors`: memorizer, popularity, chance on its own
split and draws), computed once per data set and protocol setting and
cached as JSON under the download cache (`floors/<key>.json`), so every
run reports them and only the first pays.

The key is a SHA-256 of the interactions' fingerprint, the rounds and the
flags that shape the split and the draws (`training_program.floor_key`);
a cached file is written atomically, and one that cannot be read is
computed again.

Example:
  >>> result = cached_floors(protocol, rounds=100, key={...})
  >>> floors.lines(result)
"""

import hashlib
import json
import pathlib
from typing import Optional

from tff_fedrec import atomic_files
from tff_fedrec.tasks import floors
from tff_fedrec.tasks import movielens


def cached_floors(protocol, rounds: int, key: dict,
                  cache_dir: Optional[str] = None) -> Optional[dict]:
  """`floors.floors(protocol, rounds)`, from the cache when it has them;
  None for a protocol without floors (`Protocol.chance` None)."""
  if protocol.chance() is None:
    return None
  digest = hashlib.sha256(json.dumps(
      {**key, 'rounds': rounds, 'protocol': protocol.name},
      sort_keys=True).encode()).hexdigest()
  path = (pathlib.Path(cache_dir) if cache_dir
          else movielens.default_cache_dir()) / 'floors' / f'{digest}.json'
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    pass
  result = floors.floors(protocol, rounds)
  try:
    atomic_files.write_atomically(path, json.dumps(result))
  except OSError:
    pass  # A read-only cache costs the next run the computation only.
  return result


def results_rows(result: Optional[dict]) -> list[tuple[str, str]]:
  """The results-table row of a run's floors."""
  if result is None:
    return []
  metric = result['metric']
  return [(f'floors {metric}: memorizer / popularity / chance',
           ' / '.join(f'{result[floor][metric]:.4f}'
                      for floor in ('memorizer', 'popularity', 'chance')))]
