"""The test suite ends the worker of TFF's default context at exit, as the
programs do (library tests run computations in that context)."""

from tff_fedrec.programs import worker_processes

worker_processes.stop_default_context_worker_at_exit()
