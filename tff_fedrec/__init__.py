"""tff_fedrec: federated recommendation methods as TensorFlow Federated processes."""

import atexit as _atexit
import glob as _glob
import os as _os
import signal as _signal
import sys as _sys


def _default_context_workers() -> list[int]:
  """PIDs of this process's children that TFF's default context started.

  They run `worker_binary` with `--max_concurrent_computation_calls=`, the
  command line of TFF's `local_cpp_executor_factory`. Workers started any
  other way (ours pass only `--port=`) are not this hook's to stop.
  """
  pids = []
  for path in _glob.glob(f'/proc/{_os.getpid()}/task/*/children'):
    try:
      with open(path) as f:
        children = f.read().split()
    except OSError:
      continue
    for pid in children:
      try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
          arguments = f.read().split(b'\0')
      except OSError:
        continue
      if (arguments[0].endswith(b'/worker_binary') and any(
          a.startswith(b'--max_concurrent_computation_calls=')
          for a in arguments)):
        pids.append(int(pid))
  return pids


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
  tff = _sys.modules.get('tensorflow_federated')
  if tff is None:
    return
  for pid in _default_context_workers():
    try:
      _os.kill(pid, _signal.SIGKILL)
    except ProcessLookupError:
      pass
  tff.test.set_no_default_context()


_atexit.register(_drop_tff_default_context)
