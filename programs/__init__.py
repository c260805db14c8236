"""Driver programs with flags (installed as `tff_fedrec.programs`).

Importing the package makes the process end the worker of TFF's default
context at exit (`worker_processes.stop_default_context_worker_at_exit`).
"""

from tff_fedrec.programs import worker_processes as _worker_processes

_worker_processes.stop_default_context_worker_at_exit()
