"""Flags of where the TFF computations run (group `execution`, every run)."""

from absl import flags

from tff_fedrec.programs import execution
from tff_fedrec.programs.flag_groups import group

EXECUTOR = flags.DEFINE_enum(
    'executor', 'local', ['local', 'remote'],
    'local: a TFF worker this program starts and owns. remote: the TFF '
    'workers of --workers (start each with `python -m '
    'tff_fedrec.programs.worker --port=PORT`); each round\'s clients are '
    'split among them.',
)
WORKERS = flags.DEFINE_list(
    'workers', [], 'HOST:PORT of each TFF worker for --executor=remote.'
)
WORKER_TIMEOUT = flags.DEFINE_float(
    'worker_timeout_seconds', 60.0,
    'How long a --workers worker may take to answer at the start, and (a '
    'tenth of it, at least 5 s) stay unreachable during a run, before the '
    'run stops with an error naming it.',
)
ALLOW_INSECURE_REMOTE = flags.DEFINE_bool(
    'allow_insecure_remote', False,
    'Accept worker addresses off this machine. TFF workers have no '
    'authentication or TLS.',
)


def remote_workers() -> list[str]:
  """--workers, checked; empty for --executor=local."""
  if EXECUTOR.value == 'local':
    if WORKERS.value:
      raise group.FlagError('--workers needs --executor=remote.')
    return []
  return execution.parse_worker_addresses(
      WORKERS.value, allow_insecure_remote=ALLOW_INSECURE_REMOTE.value
  )


def executor_summary() -> dict:
  """Where the computations ran; with remote workers, `peak_rss_mb` is the
  program's alone."""
  return {'kind': EXECUTOR.value, 'workers': remote_workers()}


def _check(entry) -> None:
  del entry
  remote_workers()
  group.require_finite(WORKER_TIMEOUT, positive=True)


GROUPS = (
    group.FlagGroup(
        'execution', 'where the computations run',
        (EXECUTOR, WORKERS, WORKER_TIMEOUT, ALLOW_INSECURE_REMOTE),
        check=_check,
    ),
)
