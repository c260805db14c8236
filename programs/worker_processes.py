"""The TFF `worker_binary` processes this process has started, from /proc,
the environment they start in, and the exit hook that ends the one TFF's
default context starts.

Standard library only: `tff_fedrec.programs` installs the hook when it is
imported, before TensorFlow.
"""

import atexit
import os
import signal
import sys
import time

_WORKER_BINARY = 'worker_binary'

# How long a child that already runs `worker_binary` may show an empty
# command line: the kernel switches the executable (`/proc/PID/exe`) before
# it writes the new arguments, and `subprocess.Popen` returns inside that
# window (its close-on-exec pipe closes at the switch).
_EXEC_WINDOW_SECONDS = 1.0


# glibc's malloc gives each thread that allocates an arena of its own and
# keeps what is freed there; TensorFlow's thread pools and gRPC's threads
# make many. Two arenas, measured on an APFR-GKD ML-1M run (3 rounds,
# cohorts of 256): the worker's peak 2.8 GB -> 2.2 GB, seconds per round
# no worse (29.5 -> 27.9).
_WORKER_MALLOC = {'MALLOC_ARENA_MAX': '2'}


def worker_environment(environment: dict) -> dict:
  """The environment a `worker_binary` starts in: `environment`, and
  glibc's malloc limited to two arenas unless `environment` sets it."""
  return {**_WORKER_MALLOC, **environment}


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


def _drop_tff_default_context() -> None:
  """Ends TFF's default context, and its worker, while Python is still whole.

  TFF's default local context starts `worker_binary` on first use and stops
  it only from `ServiceManager.__del__`, with SIGINT and then an unbounded
  `wait()`. Left to interpreter teardown, that runs after `subprocess` is
  gone: it prints "Exception ignored in ... ServiceManager.__del__" and the
  worker is left running, reparented to init. And where SIGINT is ignored
  (a job started with `&` from a script inherits SIG_IGN, and so does the
  worker), the SIGINT does nothing and the `wait()` never returns.

  So the worker is killed here (it holds nothing to save), and then the
  default context is replaced: that drops the last reference, and the
  `__del__` reaps the dead worker at once.
  """
  tff = sys.modules.get('tensorflow_federated')
  if tff is None:
    return
  # TFF's `local_cpp_executor_factory` starts its worker with this flag;
  # ours (`programs/execution.py`) pass only `--port=`, and are not this
  # hook's to stop.
  for pid, arguments in running_worker_children().items():
    if not any(a.startswith(b'--max_concurrent_computation_calls=')
               for a in arguments):
      continue
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  tff.test.set_no_default_context()


_installed = False


def stop_default_context_worker_at_exit() -> None:
  """Makes this process end the worker of TFF's default context at exit
  (`_drop_tff_default_context`); calling it again does nothing.

  The library installs nothing: the programs call this (their package does
  on import), and so does the test suite (conftest.py). A program of your
  own that runs computations in TFF's default context can call it too.
  """
  global _installed
  if not _installed:
    atexit.register(_drop_tff_default_context)
    _installed = True
