"""tff_fedrec: federated recommendation methods as TensorFlow Federated processes."""

import atexit as _atexit
import os as _os
import signal as _signal
import sys as _sys

from tff_fedrec import worker_processes as _worker_processes


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
  # TFF's `local_cpp_executor_factory` starts its worker with this flag;
  # ours (`programs/execution.py`) pass only `--port=`, and are not this
  # hook's to stop.
  for pid, arguments in _worker_processes.running_worker_children().items():
    if not any(a.startswith(b'--max_concurrent_computation_calls=')
               for a in arguments):
      continue
    try:
      _os.kill(pid, _signal.SIGKILL)
    except ProcessLookupError:
      pass
  tff.test.set_no_default_context()


_atexit.register(_drop_tff_default_context)
