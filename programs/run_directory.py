"""A run directory's contract: one owner, one data set, and what may change
on resume.

  <root_dir>/run.flags      every flag of the run, written when a start is
                            accepted (`start`)
  <root_dir>/run.data.json  the fingerprint of the data the run trains on
                            (`tasks.datasets.fingerprint`), written with it
  <root_dir>/run.lock       the process that holds the run, while it runs
  <root_dir>/checkpoints/   the last two checkpoints (`numpy_program_state`)
  <root_dir>/metrics.csv, tensorboard/, summary.json, peak_rss_mb.txt,
  worker.log, tflite/       what the run released and exported

**One owner.** `owned(root_dir)` holds an advisory lock (`fcntl.flock`) on
the folder itself for as long as a training process runs there; the
kernel drops it when the process ends, however it ends (`kill -9`
included), so a lock is never stale. A second start on the folder is
refused, naming the process that holds it (`run.lock`), before anything
is written.

**One run.** A killed or finished run continues with the same command and
the same --root_dir. Flags that say how long the run is and where it
executes may differ (`RESUMABLE_FLAGS`: more --rounds, another
--eval_every, remote workers ...); a difference in any other flag (the
method, the data, the model, the protocol, a seed, a hyperparameter)
would mix two runs under one label, so it is refused, naming every such
flag with both values, before anything in the directory is written; so is
data whose fingerprint is not the run's (`check_data`), and checkpoints
without the run.flags that say what they are.

**Only what it wrote.** A new run starts in an empty or missing folder; a
folder holding anything else is refused, naming what it holds. A run that
saved no checkpoint (it stopped or diverged in its first rounds) starts
over on the next start, removing what it released (`metrics.csv`,
`summary.json`, TensorBoard's event files, `peak_rss_mb.txt`), and only
those files, recognised by their content: a folder holding anything else
is refused, naming it. `check_start` does all of this, with the check that
the directory can be written at all.

Example:
  >>> with owned('runs/pfedrec'):
  ...   check_start('runs/pfedrec', current_flags, known)  # or FlagError
  ...   check_data('runs/pfedrec', fingerprint, 'ml-100k')  # or FlagError
  ...   start('runs/pfedrec', flag_lines, fingerprint)
"""

import contextlib
import errno
import fcntl
import json
import os
import re
import sys
import time
from typing import Iterator, Optional

from tff_fedrec import atomic_files
from tff_fedrec.programs.flag_groups import group

RUN_FLAGS_FILE = 'run.flags'
DATA_FILE = 'run.data.json'
LOCK_FILE = 'run.lock'
CHECKPOINTS = 'checkpoints'
METRICS_FILE = 'metrics.csv'
SUMMARY_FILE = 'summary.json'
TENSORBOARD_DIR = 'tensorboard'
PEAK_RSS_FILE = 'peak_rss_mb.txt'
# What a run releases; a start without a checkpoint removes them.
_RELEASED = (METRICS_FILE, SUMMARY_FILE, TENSORBOARD_DIR, PEAK_RSS_FILE)
# Everything else a run directory of this program may hold.
_KEPT = (RUN_FLAGS_FILE, DATA_FILE, LOCK_FILE, CHECKPOINTS, 'worker.log',
         'tflite')
# `atomic_files.write_atomically`'s temporary files, left by a kill.
_TEMPORARY = re.compile(r'\.(.+)\.[^.]+\.tmp')
# How many entries a refusal names.
_NAMED = 8
# How long the run is and where and how it executes: the same run either
# way (`users_per_tff_client` groups users without changing results;
# `cohort_size` and `cohort_state_mb` change them only by float rounding).
RESUMABLE_FLAGS = frozenset({
    'rounds', 'eval_every', 'checkpoint_every', 'max_worker_restarts',
    'executor', 'workers', 'worker_timeout_seconds', 'allow_insecure_remote',
    'users_per_tff_client', 'cohort_size', 'cohort_state_mb', 'cache_dir',
    'root_dir',
})


def parse_flag_lines(lines, known_flags) -> dict[str, str]:
  """{flag name: value} of flagfile lines ('--name=value', '--name',
  '--noname'); booleans as 'true' / 'false'."""
  values = {}
  for line in lines:
    line = line.strip()
    if not line.startswith('--'):
      continue
    name, has_value, value = line[2:].partition('=')
    if not has_value:
      if name.startswith('no') and name[2:] in known_flags:
        name, value = name[2:], 'false'
      else:
        value = 'true'
    values[name] = value
  return values


def saved_flags(root_dir: str, known_flags) -> dict[str, str] | None:
  """The flags the run in `root_dir` started with, or None if none."""
  path = os.path.join(root_dir, RUN_FLAGS_FILE)
  if not os.path.isfile(path):
    return None
  try:
    with open(path) as f:
      return parse_flag_lines(f.read().splitlines(), known_flags)
  except (OSError, UnicodeDecodeError) as error:
    raise group.FlagError(
        f'{path} cannot be read ({error}). It says how the run in '
        f'{root_dir} was started; restore it, or use a new --root_dir.'
    ) from None


def check_writable(root_dir: str) -> None:
  """FlagError unless `root_dir` is, or can be made, a writable folder."""
  if os.path.exists(root_dir) and not os.path.isdir(root_dir):
    raise group.FlagError(
        f'--root_dir={root_dir} is a file, not a folder. Give a folder for '
        'the run (it is made if missing).'
    )
  existing = os.path.abspath(root_dir)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise group.FlagError(
        f'--root_dir={root_dir} cannot be made: {existing} is a file. Give '
        'a folder path.'
    )
  if not os.access(existing, os.W_OK | os.X_OK):
    raise group.FlagError(
        f'--root_dir={root_dir} cannot be written: {existing} is not '
        'writable by this user. Give a folder you can write to.'
    )


def has_checkpoint(root_dir: str) -> bool:
  """Whether the run in `root_dir` saved any round."""
  folder = os.path.join(root_dir, CHECKPOINTS)
  return os.path.isdir(folder) and any(
      name.startswith('program_state_') and name[14:].isdigit()
      for name in os.listdir(folder)
  )


def _holder(root_dir: str) -> str:
  """Who holds `root_dir`, from its run.lock, for a refusal."""
  try:
    with open(os.path.join(root_dir, LOCK_FILE)) as f:
      holder = json.load(f)
    return (f'process {holder["pid"]} ({holder["command"]}, since '
            f'{holder["since"]})')
  except (OSError, ValueError, KeyError, TypeError):
    return 'another process (it has not said which yet)'


@contextlib.contextmanager
def owned(root_dir: str) -> Iterator[None]:
  """Within the block this process owns `root_dir` (module docstring);
  FlagError if another process does. Makes the folder if missing. When the
  block fails, the folder is left as it was: its run.lock as before, and
  the folders made here removed if still empty (a refused start leaves
  nothing behind); when it ends well, run.lock is removed."""
  check_writable(root_dir)
  made = []
  path = os.path.abspath(root_dir)
  while not os.path.exists(path):
    made.append(path)
    path = os.path.dirname(path)
  os.makedirs(root_dir, exist_ok=True)
  lock_path = os.path.join(root_dir, LOCK_FILE)
  descriptor = os.open(root_dir, os.O_RDONLY | os.O_DIRECTORY)
  try:
    try:
      fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
      if error.errno not in (errno.EWOULDBLOCK, errno.EACCES):
        raise
      raise group.FlagError(
          f'--root_dir={root_dir} is in use by {_holder(root_dir)}. One '
          'run directory has one training process: wait for it to end (or '
          'stop it; it resumes later from its last checkpoint), or give '
          'another --root_dir. Nothing was written.'
      ) from None
    try:
      with open(lock_path, 'rb') as f:
        previous = f.read()
    except FileNotFoundError:
      previous = None
    atomic_files.write_atomically(lock_path, json.dumps({
        'pid': os.getpid(),
        'command': ' '.join(sys.argv)[:500],
        'since': time.strftime('%Y-%m-%d %H:%M:%S'),
    }) + '\n')
    succeeded = False
    try:
      yield
      succeeded = True
    finally:
      if succeeded or previous is None:
        with contextlib.suppress(OSError):
          os.remove(lock_path)
      else:
        atomic_files.write_atomically(lock_path, previous)
  finally:
    os.close(descriptor)
    if made and not os.listdir(root_dir):
      for folder in made:  # the deepest first
        try:
          os.rmdir(folder)
        except OSError:
          break


def _ours(root_dir: str, name: str) -> bool:
  """Whether entry `name` of `root_dir` is one this program writes, by its
  name and, for what a start may remove, its content."""
  path = os.path.join(root_dir, name)
  match = _TEMPORARY.fullmatch(name)
  if match:
    return match.group(1) in _RELEASED + _KEPT
  if name in _KEPT:
    return True
  if name not in _RELEASED:
    return False
  try:
    if name == TENSORBOARD_DIR:
      return os.path.isdir(path) and all(
          entry.startswith('events.out.tfevents.')
          for entry in os.listdir(path))
    if not os.path.isfile(path):
      return False
    with open(path, encoding='utf-8') as f:
      text = f.read(1 << 20)
    if name == METRICS_FILE:
      return text == '' or text.startswith('round,') or text == 'round\n'
    if name == SUMMARY_FILE:
      summary = json.loads(text)
      return isinstance(summary, dict) and 'rounds_completed' in summary
    float(text)  # PEAK_RSS_FILE
    return True
  except (OSError, ValueError):
    return False


def _refuse_foreign(root_dir: str, names: list[str], why: str) -> None:
  if not names:
    return
  shown = ', '.join(sorted(names)[:_NAMED]) + (
      f' and {len(names) - _NAMED} more' if len(names) > _NAMED else '')
  raise group.FlagError(
      f'--root_dir={root_dir} holds {shown}, which this program did not '
      f'write: {why} It never removes or rewrites files it did not write. '
      'Move them out, or give another --root_dir (a new or empty folder). '
      'Nothing was written.'
  )


def check_start(root_dir: str, current: dict[str, str],
                known_flags) -> None:
  """Refuses a start that is not this run's to make (module docstring):
  a folder holding what this program did not write; checkpoints without
  run.flags; flags that differ from the run's in anything but
  `RESUMABLE_FLAGS`. A run that saved no round has nothing to resume: any
  flags start it over."""
  check_writable(root_dir)
  if not os.path.isdir(root_dir):
    return
  entries = [name for name in os.listdir(root_dir) if name != LOCK_FILE]
  saved = saved_flags(root_dir, known_flags)
  checkpointed = has_checkpoint(root_dir)
  if saved is None and checkpointed:
    raise group.FlagError(
        f'{root_dir} holds checkpoints but no {RUN_FLAGS_FILE}, which says '
        'how they were made; without it a start would take them for a new '
        f'run of whatever flags it is given. Restore {root_dir}/'
        f'{RUN_FLAGS_FILE} (from a backup, or the flags of the command that '
        'started the run, one --flag=value a line) and run that command '
        'again, or give a new --root_dir. Nothing was written.'
    )
  if saved is None:
    # A kill while run.flags was first written leaves its temporary file.
    _refuse_foreign(
        root_dir,
        [name for name in entries
         if not (_TEMPORARY.fullmatch(name) and _ours(root_dir, name))],
        'a new run starts in an empty or missing folder.')
    return
  if not checkpointed:
    _refuse_foreign(
        root_dir, [name for name in entries if not _ours(root_dir, name)],
        'a start of a run that saved no checkpoint removes what the run '
        'released, and these are not that.')
    return
  _refuse_foreign(
      root_dir,
      [name for name in entries
       if name in _RELEASED and not _ours(root_dir, name)],
      'a resumed run appends to its metrics.csv, tensorboard/ and '
      'summary.json, and these are not the run\'s.')
  differences = [
      name for name in sorted(set(saved) | set(current))
      if name not in RESUMABLE_FLAGS and name in known_flags
      and saved.get(name) != current.get(name)
  ]
  if not differences:
    return
  shown = lambda values, name: (
      f'--{name}={values[name]}' if name in values else f'--{name} unset')
  lines = '\n'.join(
      f'  {shown(saved, name)} (the run) but {shown(current, name)} (now)'
      for name in differences
  )
  raise group.FlagError(
      f'{root_dir} holds a run started with other settings:\n{lines}\n'
      'Resuming it with them would mix two runs under one label. Run the '
      'same command as before to resume it (only '
      f'{", ".join("--" + n for n in sorted(RESUMABLE_FLAGS))} may change; '
      'a flag shown unset now takes the run\'s value when given, e.g. '
      'for a run an older version started), or give a new --root_dir for '
      'a new run. Nothing was written.'
  )


def saved_data(root_dir: str) -> Optional[dict]:
  """The data fingerprint the run in `root_dir` recorded, or None."""
  path = os.path.join(root_dir, DATA_FILE)
  if not os.path.isfile(path):
    return None
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except (OSError, ValueError) as error:
    raise group.FlagError(
        f'{path} cannot be read ({error}). It records the data the run in '
        f'{root_dir} trains on; restore it, or use a new --root_dir.'
    ) from None


def check_data(root_dir: str, fingerprint: dict, source: str) -> None:
  """FlagError if the run in `root_dir` has checkpoints and recorded other
  data than `fingerprint` (the loaded data's, from `source`): resuming, or
  exporting, on other data would mix two data sets under one run (its
  users' states belong to the rows it split)."""
  saved = saved_data(root_dir)
  if saved is None or not has_checkpoint(root_dir) or saved == fingerprint:
    return
  counts = lambda f: (f'{f.get("interactions")} interactions of '
                      f'{f.get("users")} users and {f.get("items")} items')
  raise group.FlagError(
      f'The data of the run in {root_dir} has changed: {source} now gives '
      f'{counts(fingerprint)} (sha256 {str(fingerprint.get("sha256"))[:12]}), '
      f'the run trained on {counts(saved)} (sha256 '
      f'{str(saved.get("sha256"))[:12]}). A run resumes and exports only '
      'on the data it started with: restore that file, or give a new '
      '--root_dir to train on the new data. Nothing was written.'
  )


def start(root_dir: str, lines: list[str],
          data_fingerprint: Optional[dict] = None) -> None:
  """Makes `root_dir` the run's: writes <root_dir>/run.flags and the data
  fingerprint (each atomically), so that a resume can check them and
  `export` can rebuild the run; a run directory without a checkpoint
  starts over, so what an earlier attempt released there (this program's
  files only, `check_start`) is removed."""
  os.makedirs(root_dir, exist_ok=True)
  if (os.path.isfile(os.path.join(root_dir, RUN_FLAGS_FILE))
      and not has_checkpoint(root_dir)):
    for name in _RELEASED:
      if not _ours(root_dir, name):
        continue
      path = os.path.join(root_dir, name)
      if os.path.isdir(path):
        for entry in os.listdir(path):
          os.remove(os.path.join(path, entry))
        os.rmdir(path)
      else:
        os.remove(path)
  # run.flags first: a kill between the two leaves a run that saved no
  # round, which the next start begins again, writing both.
  atomic_files.write_atomically(
      os.path.join(root_dir, RUN_FLAGS_FILE), '\n'.join(lines) + '\n'
  )
  if data_fingerprint is not None:
    atomic_files.write_atomically(
        os.path.join(root_dir, DATA_FILE),
        json.dumps(data_fingerprint, indent=1, sort_keys=True) + '\n',
    )
