"""tff_fedrec: federated recommendation methods as TensorFlow Federated processes."""

import atexit as _atexit
import sys as _sys


def _drop_tff_default_context() -> None:
  """Ends TFF's default context while the interpreter is still whole.

  TFF's default local context starts `worker_binary` on first use and stops
  it only from `ServiceManager.__del__`. Left to interpreter teardown, that
  runs after `subprocess` is gone: it prints "Exception ignored in ...
  ServiceManager.__del__" and the worker is left running, reparented to
  init. Replacing the default context at exit drops the last reference,
  so the `__del__` stops the worker (SIGINT, then wait) in time.
  """
  tff = _sys.modules.get('tensorflow_federated')
  if tff is not None:
    tff.test.set_no_default_context()


_atexit.register(_drop_tff_default_context)
