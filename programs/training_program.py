"""The training program's logic, shared by its two binaries.

`train` (`python -m tff_fedrec.programs.train`) trains a run from the
flags; `export` rebuilds a finished or checkpointed run from the flags it
saved (`run.flags`) to read its models. See train.py for the usage.

The program holds no method or protocol names: the chosen method's
registry entry (`registry.MethodEntry`) gives its builder, its protocol
(made from the flags by `flag_groups.protocols.PROTOCOLS`) and the flag
groups it takes (`flag_groups`); the flags of every other group are
refused if given, and those of its groups become the builder's arguments.
Every run takes the common groups, its users' tiers among them: every
method is given them, every protocol reports by them.
"""

import dataclasses
import os
import sys
from typing import Callable, Optional

# TensorFlow's C++ start-up notices (CUDA factories registered twice, and
# the like) would bury the progress lines.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app
from absl import flags
from absl import logging

from tff_fedrec.algorithms import method as method_lib
from tff_fedrec.algorithms import registry
from tff_fedrec.programs import execution
from tff_fedrec.programs import interrupts
from tff_fedrec.programs import paired_runs
from tff_fedrec.programs import protocol_floors
from tff_fedrec.programs import run_directory
from tff_fedrec.programs import training_loop
from tff_fedrec.programs.flag_groups import apfr_gkd as apfr_gkd_flags
from tff_fedrec.programs.flag_groups import data as data_flags
from tff_fedrec.programs.flag_groups import exchange as exchange_flags
from tff_fedrec.programs.flag_groups import execution as execution_flags
from tff_fedrec.programs.flag_groups import fedrap as fedrap_flags
from tff_fedrec.programs.flag_groups import group
from tff_fedrec.programs.flag_groups import protocols as protocol_flags
from tff_fedrec.programs.flag_groups import rf2 as rf2_flags
from tff_fedrec.programs.flag_groups import run as run_flags
from tff_fedrec.programs.flag_groups import tiered as tiered_flags
from tff_fedrec.programs.flag_groups import (
    tier_optimization as tier_optimization_flags)
from tff_fedrec.programs.flag_groups import tiers as tiers_flags
from tff_fedrec.programs.flag_groups import training as training_flags
from tff_fedrec.tasks import datasets
from tff_fedrec.tasks import errors
from tff_fedrec.tasks import floors
from tff_fedrec.tasks import split_cache

FlagError = group.FlagError
RUN_FLAGS_FILE = run_directory.RUN_FLAGS_FILE
# Every run takes these groups; its method and protocol add theirs.
COMMON_GROUPS = ('data', 'run', 'execution', 'tiers', 'tier_optimization')

# Every group, in the order --help shows them: the common ones, the
# protocols', the shared training ones, then each paper's.
GROUPS = {
    flag_group.name: flag_group
    for module in (data_flags, run_flags, execution_flags, tiers_flags,
                   tier_optimization_flags, protocol_flags, training_flags,
                   exchange_flags, tiered_flags, apfr_gkd_flags, fedrap_flags,
                   rf2_flags)
    for flag_group in module.GROUPS
}


def refuse_unused_flags(entry: registry.MethodEntry) -> None:
  """FlagError for a flag given a value by a group `entry` does not take."""
  used = {*COMMON_GROUPS, entry.protocol, *entry.flag_groups}
  for name, flag_group in GROUPS.items():
    if name in used:
      continue
    for holder in flag_group.changed():
      users = registry.methods_taking(name)
      raise FlagError(
          f'--{holder.name} does not apply to --method={entry.name}: it sets '
          f'{flag_group.title}, which only {", ".join(users)} take. Drop '
          'the flag.'
      )


def _load_data(entry: registry.MethodEntry, data_config: datasets.DataConfig,
               root_dir: str):
  """The split the run trains on, and the fingerprint of the interactions
  it was made from (`datasets.fingerprint`), checked against the run's in
  `root_dir` before the split (whose errors a changed file can cause).
  Splits of at least `split_cache.CACHED_FROM_USERS` users are made once
  and memory-mapped from the cache afterwards (`tasks.split_cache`)."""
  protocol = protocol_flags.PROTOCOLS[entry.protocol]
  settings = {'protocol': entry.protocol, **protocol.split_settings(),
              **dataclasses.asdict(data_config)}
  del settings['cache_dir']

  def loaded():
    interactions = datasets.load_interactions(data_config)
    return interactions, datasets.fingerprint(interactions)

  def split(interactions, fingerprint):
    return protocol.split(data_config, interactions), fingerprint

  def check(fingerprint):
    run_directory.check_data(root_dir, fingerprint,
                             datasets.source(data_config))

  if (data_config.dataset == 'synthetic'
      and data_config.synthetic_users >= split_cache.CACHED_FROM_USERS):
    # Known before generating (a million users take minutes to make); its
    # split fails for no file, so the check may follow it.
    data, fingerprint = split_cache.cached_split(
        settings, lambda: split(*loaded()), data_config.cache_dir)
    check(fingerprint)
  else:
    interactions, fingerprint = loaded()
    check(fingerprint)
    if fingerprint['users'] >= split_cache.CACHED_FROM_USERS:
      data, _ = split_cache.cached_split(
          {**settings, 'fingerprint': fingerprint},
          lambda: split(interactions, fingerprint), data_config.cache_dir)
    else:
      data, _ = split(interactions, fingerprint)
  if not data.num_users:
    raise FlagError(
        f'--min_interactions={data_flags.MIN_INTERACTIONS.value} drops every '
        f'user of {data_config.data_path or data_config.dataset}: no user has '
        'that many interactions. Lower it.'
    )
  return data, fingerprint


def known_flags() -> set[str]:
  """The names of this program's flags."""
  return {holder.name for flag_group in GROUPS.values()
          for holder in flag_group.holders}


def current_flags() -> dict[str, str]:
  """{flag: value} of this program's flags as they are now."""
  return run_directory.parse_flag_lines(_flag_lines(), known_flags())


def builder_arguments(entry: registry.MethodEntry,
                      run_data: method_lib.RunData) -> dict:
  """The builder's keyword arguments from the entry's flag groups."""
  context = group.BuildContext(entry=entry, data=run_data)
  arguments, training_fields = {}, {}
  for name in (*COMMON_GROUPS, *entry.flag_groups):
    for key, value in GROUPS[name].arguments(context).items():
      if key == 'training':
        training_fields.update(value)
      else:
        arguments[key] = value
  if training_fields:
    arguments['training'] = dataclasses.replace(
        entry.default('training'), **training_fields
    )
  return arguments


@dataclasses.dataclass(frozen=True)
class PreparedRun:
  """A run built from the flags, before any round: what `run` trains and
  what `export` reads checkpoints with.

  Attributes:
    entry: The method's registry entry.
    data: The loaded split.
    method: The built `method.Method`.
    protocol: Its `tasks.protocol.Protocol`.
    root_dir: --root_dir.
    make_training_run: worker_pid -> `training_loop.TrainingRun`.
    data_fingerprint: `datasets.fingerprint` of the loaded interactions.
  """

  entry: registry.MethodEntry
  data: object
  method: method_lib.Method
  protocol: object
  root_dir: str
  make_training_run: Callable[[Optional[int]], training_loop.TrainingRun]
  data_fingerprint: dict

  @property
  def method_name(self) -> str:
    return self.entry.name


def check_flags() -> registry.MethodEntry:
  """The chosen method's entry, once every flag's value is checked
  (FlagError naming the first bad one), before anything is read or
  written."""
  if run_flags.METHOD.value is None:
    raise FlagError(
        f'--method is required: one of {", ".join(registry.METHODS)}.'
    )
  if not run_flags.ROOT_DIR.value:
    raise FlagError(
        '--root_dir is required (checkpoints and results go there).'
    )
  entry = registry.get(run_flags.METHOD.value)
  refuse_unused_flags(entry)
  # Every value checked before the data loads, and the run directory before
  # anything is written.
  for name in (*COMMON_GROUPS, entry.protocol, *entry.flag_groups):
    GROUPS[name].check(entry)
  return entry


# Flags that do not shape a run's split or its draws, so not its floors'.
_NOT_FLOOR_FLAGS = frozenset({
    'method', 'root_dir', 'eval_every', 'checkpoint_every',
    'users_per_tff_client', 'cohort_size', 'cohort_state_mb',
    'client_store', 'max_worker_restarts', 'paired_baseline'})


def floor_key(fingerprint: dict) -> dict:
  """What a run's floors depend on (`protocol_floors`): the data and the
  values of the common groups' and the protocols' flags that shape the
  split and the draws."""
  names = {holder.name
           for name in (*COMMON_GROUPS, *protocol_flags.PROTOCOLS)
           if name != 'execution'
           for holder in GROUPS[name].holders} - _NOT_FLOOR_FLAGS
  flags_now = current_flags()
  return {'fingerprint': fingerprint,
          'flags': {name: flags_now.get(name) for name in sorted(names)}}


def protocol_of(name: str, data):
  """(the protocol `name` of the split `data` as the flags build it, the
  users' tiers by --device_tiers or --tier_ratio)."""
  tier_policy = tiers_flags.tier_policy()
  protocol_from_flags = protocol_flags.PROTOCOLS[name]
  user_tiers = tier_policy.assign(
      data.train_offsets, data.train_items, run_flags.SEED.value,
      clicks=protocol_from_flags.clicks(data))
  return (protocol_from_flags.build(data, user_tiers, tier_policy.tier_names),
          user_tiers)


def prepare_run(*, log: Callable[[str], None] = print,
                starting: bool = True,
                entry: Optional[registry.MethodEntry] = None) -> PreparedRun:
  """Checks the flags, loads the data and builds the method; `starting`
  (a training start, not an export, inside `run_directory.owned`) also
  checks the run directory (`run_directory.check_start`). Data that is not
  the data the run in --root_dir recorded is refused either way
  (`run_directory.check_data`). `entry`: `check_flags()`'s answer, if the
  caller has it."""
  entry = entry or check_flags()
  paired_baseline = tier_optimization_flags.PAIRED_BASELINE.value
  if starting:
    run_directory.check_start(
        run_flags.ROOT_DIR.value, current_flags(), known_flags()
    )
    if paired_baseline is not None:
      paired_runs.check_baseline(paired_baseline, current_flags())
  data_config = data_flags.data_config(run_flags.SEED.value)
  data, fingerprint = _load_data(entry, data_config, run_flags.ROOT_DIR.value)
  tier_policy = tiers_flags.tier_policy()
  protocol, user_tiers = protocol_of(entry.protocol, data)
  run_data = protocol.run_data(user_tiers)
  method = entry.build(
      data=run_data, seed=run_flags.SEED.value,
      **builder_arguments(entry, run_data),
  )
  loop_config = training_loop.LoopConfig(
      rounds=run_flags.rounds(protocol.rounds_per_epoch),
      eval_every=run_flags.EVAL_EVERY.value or protocol.default_eval_every,
      checkpoint_every=run_flags.CHECKPOINT_EVERY.value,
      users_per_client=run_flags.USERS_PER_TFF_CLIENT.value,
      cohort_size=run_flags.COHORT_SIZE.value,
      cohort_state_bytes=int(run_flags.COHORT_STATE_MB.value * 2**20) or None,
      client_store=run_flags.CLIENT_STORE.value,
  )
  summary_fields = {
      'floors': protocol_floors.cached_floors(
          protocol, loop_config.rounds, floor_key(fingerprint),
          data_flags.CACHE_DIR.value) if starting else None,
      'method': entry.name,
      'dataset': data_config.dataset,
      'executor': execution_flags.executor_summary(),
      'config': {
          'protocol': protocol.name,
          'tiers': tier_policy.description,
          'clients_per_round': protocol.clients_per_round,
          'loop': dataclasses.asdict(loop_config),
          **method.config_summary(),
      },
  }
  log(f'{entry.name} on {data_config.dataset}: {data.num_users} users, '
      f'{data.num_items} items, {protocol.clients_per_round} clients per '
      f'round ({protocol.rounds_per_epoch} rounds per epoch); '
      f'{method.description()}')
  root_dir = run_flags.ROOT_DIR.value
  return PreparedRun(
      entry=entry,
      data=data,
      method=method,
      protocol=protocol,
      root_dir=root_dir,
      make_training_run=lambda worker_pid: training_loop.TrainingRun(
          method, protocol, loop_config, root_dir,
          log=log, worker_pid=worker_pid, summary_fields=summary_fields,
          paired_baseline=paired_baseline,
      ),
      data_fingerprint=fingerprint,
  )


def results_table(summary: dict, protocol, method: method_lib.Method,
                  root_dir: str) -> str:
  """The printed results: the protocol's rows, the run's cost, and the
  method's rows."""
  if summary['executor']['kind'] == 'remote':
    rss = 'peak RSS (this program; remote workers not counted)'
  else:
    rss = 'peak RSS (program + TFF worker)'
  rows = [
      ('method', summary['method']),
      ('dataset', summary['dataset']),
      ('rounds completed', str(summary['rounds_completed'])),
      *protocol.results_rows(summary),
      ('seconds per round (median)', f'{summary["seconds_per_round"]:.2f}'),
      (rss, f'{summary["peak_rss_mb"]:.0f} MB'),
      *method.results_rows(summary),
      *paired_runs.mdac_row(summary),
      *protocol_floors.results_rows(summary.get('floors')),
      ('outputs', f'{root_dir}: summary.json, metrics.csv, checkpoints/, '
       'tensorboard/'),
  ]
  width = max(len(name) for name, _ in rows)
  return '\n'.join(f'{name:<{width}}  {value}' for name, value in rows)


def _train_with_worker_restarts(
    root_dir: str, train: Callable[[Optional[int]], dict]
):
  """Runs `train(worker_pid)` on a TFF worker of its own; if the worker
  dies, restarts it and calls `train` again (which resumes from the last
  checkpoint), at most --max_worker_restarts times.

  With --executor=remote, runs `train(None)` on the --workers instead; they
  are not ours to restart, so a worker that stops answering ends the run
  with `WorkerDiedError` (the last checkpoint stays intact)."""
  workers = execution_flags.remote_workers()
  if workers:
    timeout = execution_flags.WORKER_TIMEOUT.value
    print(f'TFF workers: {", ".join(workers)}.', flush=True)
    with execution.remote_workers_context(
        workers,
        ready_timeout_seconds=timeout,
        unreachable_seconds=max(5.0, timeout / 10),
    ):
      return train(None)
  restarts = 0
  limit = run_flags.MAX_WORKER_RESTARTS.value
  while True:
    try:
      with execution.worker_execution_context(
          log_path=os.path.join(root_dir, 'worker.log')
      ) as worker_pid:
        return train(worker_pid)
    except execution.WorkerDiedError as error:
      if restarts >= limit:
        raise
      restarts += 1
      print(
          f'{error} Restarting it and resuming from the last checkpoint '
          f'(restart {restarts} of at most {limit}).',
          flush=True,
      )


def help_text(method: Optional[str] = None) -> str:
  """This program's flags by group, with the methods that take each group;
  with `method`, only the groups that method takes."""
  lines = [
      'Trains a federated recommender with TFF and prints a results table.',
      '',
      '  python -m tff_fedrec.programs.train --method=METHOD '
      '--dataset=ml-100k --root_dir=DIR [flags]',
      '  python -m tff_fedrec.programs.train '
      '--flagfile=programs/presets/pfedrec_ml100k.flags',
      '',
      f'Methods: {", ".join(registry.METHODS)}.',
  ]
  used = None
  if method in registry.METHODS:
    entry = registry.METHODS[method]
    used = {*COMMON_GROUPS, entry.protocol, *entry.flag_groups}
    lines.append(f'Flags --method={method} takes ({entry.paper}):')
  for name in GROUPS:
    if used is not None and name not in used:
      continue
    flag_group = GROUPS[name]
    takers = ('every method' if name in COMMON_GROUPS
              else ', '.join(registry.methods_taking(name)))
    lines += ['', f'{flag_group.title} [{name}; {takers}]:']
    for holder in flag_group.holders:
      flag = flags.FLAGS[holder.name]
      default = '' if flag.default is None else f' (default: {flag.default_as_str})'
      lines.append(f'  --{holder.name}{default}')
      lines.append(f'      {flag.help}')
  lines += ['', 'absl and TensorFlow flags: --helpfull.']
  return '\n'.join(lines)


def flagfiles_first(argv: list[str]) -> list[str]:
  """`argv` with its --flagfile arguments moved before the other flags, in
  their order, so that a flag given on the command line overrides a
  preset's wherever it stands (absl applies flags in order: given before
  --flagfile, it was silently replaced by the preset's)."""
  program, rest = argv[:1], argv[1:]
  flagfiles, others = [], []
  index = 0
  while index < len(rest):
    argument = rest[index]
    if argument == '--':
      others += rest[index:]
      break
    name = argument.lstrip('-').partition('=')[0]
    if argument.startswith('-') and name == 'flagfile':
      if '=' in argument or index + 1 == len(rest):
        flagfiles.append(argument)
      else:
        flagfiles += rest[index:index + 2]
        index += 1
    else:
      others.append(argument)
    index += 1
  return program + flagfiles + others


def _flag_lines() -> list[str]:
  """This program's flags as flagfile lines."""
  names = sorted(
      holder.name for flag_group in GROUPS.values()
      for holder in flag_group.holders
  )
  return [
      line for line in (flags.FLAGS[name].serialize() for name in names)
      if line
  ]


def run() -> dict:
  """Runs the program from the parsed flags; returns the summary."""
  log = lambda line: print(line, flush=True)
  entry = check_flags()
  with run_directory.owned(run_flags.ROOT_DIR.value):
    prepared = prepare_run(log=log, entry=entry)
    # A run none of whose checkpoints reads back is refused before the
    # directory is touched.
    training_loop.checkpoint_manager(prepared.root_dir).check_readable()
    run_directory.start(prepared.root_dir, _flag_lines(),
                        prepared.data_fingerprint)
    summary = _train_with_worker_restarts(
        prepared.root_dir,
        lambda worker_pid: prepared.make_training_run(worker_pid).train(),
    )
  print(results_table(summary, prepared.protocol, prepared.method,
                      prepared.root_dir), flush=True)
  if summary.get('floors'):
    # The figures above read against what learning nothing shared reaches.
    print('\n'.join(floors.lines(summary['floors'])), flush=True)
  return summary


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.WARNING)
  try:
    with interrupts.handled():
      run()
  except KeyboardInterrupt:
    print(
        '\nInterrupted. Every round saved so far is in --root_dir='
        f'{run_flags.ROOT_DIR.value} (checkpoints/); run the same command '
        'again to resume from the last one.',
        file=sys.stderr, flush=True,
    )
    sys.exit(130)
  except execution.WorkerDiedError as error:
    restart = (
        'start the worker again and '
        if execution_flags.EXECUTOR.value == 'remote' else ''
    )
    print(
        f'error: {error} The last checkpoint in --root_dir is intact; '
        f'{restart}run the same command again to resume from it.',
        file=sys.stderr, flush=True,
    )
    sys.exit(3)
  except (FlagError, errors.DataFormatError, errors.DatasetFetchError,
          execution.WorkerStartError, ValueError) as error:
    print(f'error: {error}', file=sys.stderr, flush=True)
    sys.exit(2)
