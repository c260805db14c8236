"""The TFF `worker_binary` processes this process has started, from /proc.

Standard library only: `tff_fedrec/__init__.py` imports it for its exit
hook, before TensorFlow.
"""

import os
import time

_WORKER_BINARY = 'worker_binary'

# How long a child that already runs `worker_binary` may show an empty
# command line: the kernel switches the executable (`/proc/PID/exe`) before
# it writes the new arguments, and `subprocess.Popen` returns inside that
# window (its close-on-exec pipe closes at the switch).
_EXEC_WINDOW_SECONDS = 1.0


def running_worker_children() -> dict[int, list[bytes]]:
  """This process's live children that run `worker_binary`.

  A child counts by its executable, not its command line, so a worker that
  `Popen` has just returned is listed even while the kernel is still
  finishing its exec; its arguments are read once the exec is done.

  Returns:
    {PID: its command line}. Zombies (ended, not yet reaped) are left out.
  """
  workers = {}
  task_dir = f'/proc/{os.getpid()}/task'
  for task in os.listdir(task_dir):
    try:
      with open(f'{task_dir}/{task}/children') as f:
        children = f.read().split()
    except OSError:  # The thread ended meanwhile.
      continue
    for pid in children:
      if not is_running_worker(pid):
        continue
      try:
        workers[int(pid)] = _command_line_after_exec(pid)
      except OSError:  # The child ended meanwhile.
        continue
  return workers


def is_running_worker(pid: int | str) -> bool:
  """Whether process `pid`, anyone's, runs `worker_binary` and has not ended.

  Read from its executable, so it holds from the moment `Popen` returns
  (see above). A zombie (ended, not yet reaped) does not count.
  """
  try:
    return _executable_name(pid) == _WORKER_BINARY and _state(pid) != 'Z'
  except OSError:  # No such process, or it ended meanwhile.
    return False


def _executable_name(pid: int | str) -> str:
  path = os.readlink(f'/proc/{pid}/exe')
  return os.path.basename(path.removesuffix(' (deleted)'))


def _state(pid: int | str) -> str:
  with open(f'/proc/{pid}/stat') as f:
    return f.read().rsplit(')', 1)[1].split()[0]


def _command_line_after_exec(pid: str) -> list[bytes]:
  """`pid`'s arguments, waiting out the exec window (see above)."""
  deadline = time.monotonic() + _EXEC_WINDOW_SECONDS
  while True:
    with open(f'/proc/{pid}/cmdline', 'rb') as f:
      command_line = f.read()
    if command_line or time.monotonic() > deadline:
      return command_line.split(b'\0')[:-1]
    time.sleep(0.001)
