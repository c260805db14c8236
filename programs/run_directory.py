"""A run directory's contract: what it holds and what may change on resume.

  <root_dir>/run.flags      every flag of the run, written when a start is
                            accepted (`write_run_flags`)
  <root_dir>/checkpoints/   the last two checkpoints (`numpy_program_state`)
  <root_dir>/metrics.csv, tensorboard/, summary.json, peak_rss_mb.txt,
  worker.log, tflite/       what the run released and exported

A killed or finished run continues with the same command and the same
--root_dir. Flags that say how long the run is and where it executes may
differ (`RESUMABLE_FLAGS`: more --rounds, another --eval_every, remote
workers ...); a difference in any other flag (the method, the data, the
model, the protocol, a seed, a hyperparameter) would mix two runs under one
label, so it is refused, naming every such flag with both values, before
anything in the directory is written. `check_start` is that check, with
the one that the directory can be written at all.

Example:
  >>> check_start('runs/pfedrec', current_flags, known)  # FlagError or None
  >>> start('runs/pfedrec', flag_lines)
"""

import os
import shutil

from tff_fedrec import atomic_files
from tff_fedrec.programs.flag_groups import group

RUN_FLAGS_FILE = 'run.flags'
CHECKPOINTS = 'checkpoints'
# What a run releases; a start without a checkpoint replaces them.
_RELEASED = ('metrics.csv', 'summary.json', 'tensorboard')
# How long the run is and where and how it executes: the same run either
# way (`users_per_tff_client` groups users without changing results).
RESUMABLE_FLAGS = frozenset({
    'rounds', 'eval_every', 'checkpoint_every', 'max_worker_restarts',
    'executor', 'workers', 'worker_timeout_seconds', 'allow_insecure_remote',
    'users_per_tff_client', 'cache_dir', 'root_dir',
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


def check_start(root_dir: str, current: dict[str, str],
                known_flags) -> None:
  """Refuses a start whose flags differ from those of the run already in
  `root_dir` in anything but `RESUMABLE_FLAGS` (module docstring). A run
  that saved no round (it stopped or diverged in its first rounds) has
  nothing to resume: any flags start it over."""
  check_writable(root_dir)
  saved = saved_flags(root_dir, known_flags)
  if saved is None or not has_checkpoint(root_dir):
    return
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


def start(root_dir: str, lines: list[str]) -> None:
  """Makes `root_dir` the run's: writes <root_dir>/run.flags (atomically),
  the flags of the run, so that a resume can check them and `export` can
  rebuild the run; a run directory without a checkpoint starts over, so
  what an earlier attempt released there is removed."""
  os.makedirs(root_dir, exist_ok=True)
  if (os.path.isfile(os.path.join(root_dir, RUN_FLAGS_FILE))
      and not has_checkpoint(root_dir)):
    for name in _RELEASED:
      path = os.path.join(root_dir, name)
      if os.path.isdir(path):
        shutil.rmtree(path)
      elif os.path.exists(path):
        os.remove(path)
  atomic_files.write_atomically(
      os.path.join(root_dir, RUN_FLAGS_FILE), '\n'.join(lines) + '\n'
  )
