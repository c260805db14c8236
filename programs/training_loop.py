"""Program logic: the one training loop of every method and protocol.

Per round r (0-based):
  1. the protocol draws the round's users and examples, seeded by
     (seed, r), so a resumed run draws exactly what an uninterrupted one
     would have drawn (`tasks.protocol.Protocol.round_input`), round r + 1's
     on a thread while round r trains (`tff_fedrec.one_ahead`); the loop
     marks the users for whom it is the last round of the run
     (`last_rounds`: their state is kept whole for export, the others'
     may keep only what the protocol scores);
  2. the method runs its TFF process on them and writes their new client
     state to the store (`method.Method.run_round`);
  3. every `eval_every` rounds (and after the last) the protocol scores
     every user's own model (`Protocol.evaluate`);
  4. the round's row (the method's figures, the evaluation, seconds) is
     released (metrics.csv, TensorBoard), and every `checkpoint_every`
     rounds (and after the last) the program state is saved: server
     state, client-state store, next round, history.

The summary (summary.json, printed as a table) is the protocol's report
(`Protocol.summary`), the method's fields (`Method.summary_fields`), and
the run's cost.
"""

import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import resource
import statistics
import time
from typing import Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import atomic_files
from tff_fedrec import one_ahead
from tff_fedrec.algorithms import method as method_lib
from tff_fedrec.programs import interrupts
from tff_fedrec.programs import numpy_program_state
from tff_fedrec.programs import paired_runs
from tff_fedrec.programs import run_directory
from tff_fedrec.tasks import protocol as protocol_lib
from tff_fedrec.templates import cohorts


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """Round structure of a training run.

  Attributes:
    rounds: Total communication rounds.
    eval_every: Evaluate every this many rounds (and after the last one).
    checkpoint_every: Save program state every this many rounds (and after
      the last one); a killed run resumes from the last save.
    users_per_client: Users one TFF client simulates (`user_groups`).
    cohort_size: At most this many users train at once (`cohorts`); None:
      all of a round's users.
    cohort_state_bytes: None, or fewer users than `cohort_size` train at
      once when their client state would pass this many bytes
      (`cohorts.bounded_cohort_size`, from the store's mean at each round).
    client_store: 'memory' (every checkpoint writes the whole store) or
      'disk' (the users' arrays in an SQLite database in the checkpoints
      folder, whose commit is the store's part of a checkpoint:
      `client_state_store.ClientStateStore.keep_on_disk`).
  """

  rounds: int
  eval_every: int = 1
  checkpoint_every: int = 1
  users_per_client: int = 1
  cohort_size: Optional[int] = None
  cohort_state_bytes: Optional[int] = None
  client_store: str = 'memory'

  def __post_init__(self):
    if self.client_store not in CLIENT_STORES:
      raise ValueError(f'client_store must be one of {CLIENT_STORES}; got '
                       f'{self.client_store!r}.')
    for name in ('rounds', 'eval_every', 'checkpoint_every',
                 'users_per_client', 'cohort_size', 'cohort_state_bytes'):
      value = getattr(self, name)
      if value is not None and value < 1:
        raise ValueError(f'{name} must be at least 1; got {value}.')


def last_rounds(protocol: protocol_lib.Protocol, rounds: range,
                num_users: int) -> np.ndarray:
  """Each user's last round among `rounds` (-1: it trains in none of
  them), from the protocol's draws of users (`Protocol.round_users`),
  latest round first, stopping once every user has one: one draw when
  every user trains every round.

  Returns int64 [num_users].
  """
  last = np.full([num_users], -1, np.int64)
  unseen = num_users
  for round_num in reversed(rounds):
    users = np.asarray(protocol.round_users(round_num), np.int64)
    new = users[last[users] < 0]
    last[new] = round_num
    unseen -= new.size
    if not unseen:
      break
  return last


class TrainingDivergedError(ValueError):
  """A round left the training loss or the server state non-finite."""


def raise_if_diverged(
    round_num: int, train_loss: float, server_state, last_saved_round: int
) -> None:
  """Stops a run whose round `round_num` (0-based) gave a non-finite
  training loss or server state, before that state is evaluated or
  checkpointed (a resume would otherwise start from NaN). Rounds are
  seeded, so the same flags diverge again at the same round.

  Raises:
    TrainingDivergedError: naming the round, the last saved round and what
      to change.
  """
  leaves = [np.asarray(x) for x in tf.nest.flatten(server_state)]
  finite_state = all(
      np.isfinite(x).all() for x in leaves if np.issubdtype(x.dtype, np.number)
  )
  if np.isfinite(train_loss) and finite_state:
    return
  what = ('the server state has non-finite values' if np.isfinite(train_loss)
          else f'the training loss is {train_loss}')
  if last_saved_round:
    saved = (f'the last checkpoint holds round {last_saved_round}; the same '
             '--root_dir resumes from it, a new one starts over')
  else:
    saved = ('no round was saved, so the same --root_dir starts the run '
             'over')
  raise TrainingDivergedError(
      f'training diverged at round {round_num + 1}: {what}. That round was '
      f'not saved; {saved}. Lower the learning rates (--learning_rate, and '
      '--item_learning_rate or --user_learning_rate where the method has '
      'them) and run again.'
  )


def peak_rss_mb(worker_pid: Optional[int]) -> float:
  """Peak resident memory of this process plus the TFF worker, in MB."""
  peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  if worker_pid is not None:
    try:
      with open(f'/proc/{worker_pid}/status') as status:
        for line in status:
          if line.startswith('VmHWM:'):
            peak_kb += int(line.split()[1])
    except OSError:
      pass
  return peak_kb / 1024.0


PEAK_RSS_FILE = 'peak_rss_mb.txt'


def run_peak_rss_mb(root_dir: str, worker_pid: Optional[int]) -> float:
  """Peak resident memory of the run so far, over every process it took.

  A run that was resumed (after a kill, or to add rounds) was trained by
  several processes, each with its own peak (`peak_rss_mb`). The largest so
  far is kept in <root_dir>/peak_rss_mb.txt, updated at every checkpoint and
  at the end, so summary.json reports the run's peak, not the last
  process's.
  """
  peak = peak_rss_mb(worker_pid)
  path = os.path.join(root_dir, PEAK_RSS_FILE)
  try:
    with open(path) as f:
      peak = max(peak, float(f.read()))
  except (OSError, ValueError):
    pass  # No earlier process, or a file this function did not write.
  atomic_files.write_atomically(path, f'{peak:.1f}\n')
  return peak


# Where a run keeps its users' client state: `LoopConfig.client_store`.
CLIENT_STORES = ('memory', 'disk')
# The database of a run with client_store='disk', in its checkpoints folder.
CLIENT_STATES_FILE = 'client_states.sqlite'


def checkpoint_manager(
    root_dir: str,
) -> numpy_program_state.NumpyProgramStateManager:
  """The run's checkpoints, <root_dir>/checkpoints, keeping the last two
  (.npy files: TFF's SavedModel manager keeps a copy of large client state
  resident, see `numpy_program_state`)."""
  return numpy_program_state.NumpyProgramStateManager(
      os.path.join(root_dir, run_directory.CHECKPOINTS), keep_total=2
  )


def write_summary_json(root_dir: str, summary: dict) -> None:
  """Writes <root_dir>/summary.json atomically (temporary file, rename)."""
  atomic_files.write_atomically(
      os.path.join(root_dir, 'summary.json'),
      json.dumps(summary, indent=2, sort_keys=True),
  )


def scalar_fields(row: dict) -> collections.OrderedDict:
  """The row's numbers for metrics.csv and TensorBoard: top-level floats,
  and the floats of a nested evaluation (e.g. `test`) as test_<name>;
  '@' becomes '_at_' (TensorBoard's tag names)."""
  fields = collections.OrderedDict()
  for key, value in row.items():
    if key == 'round':
      continue
    if isinstance(value, dict):
      for name, inner in value.items():
        if isinstance(inner, (int, float)):
          fields[f'{key}_{name}'] = inner
    elif isinstance(value, (int, float)):
      fields[key] = value
  return collections.OrderedDict(
      (key.replace('@', '_at_'), np.float64(value))
      for key, value in fields.items()
  )


class TrainingRun:
  """One training run of a `method.Method` under a `Protocol`."""

  def __init__(
      self,
      method: method_lib.Method,
      protocol: protocol_lib.Protocol,
      config: LoopConfig,
      root_dir: str,
      *,
      log: Callable[[str], None] = print,
      worker_pid: Optional[int] = None,
      summary_fields: Optional[dict] = None,
      paired_baseline: Optional[str] = None,
  ):
    self.method = method
    self.protocol = protocol
    self._config = config
    self._root_dir = root_dir
    self._log = log
    self._worker_pid = worker_pid
    self._summary_fields = dict(summary_fields or {})
    self._paired_baseline = paired_baseline
    os.makedirs(root_dir, exist_ok=True)
    self._state_manager = checkpoint_manager(root_dir)
    self._csv = tff.program.CSVFileReleaseManager(
        os.path.join(root_dir, 'metrics.csv'), key_fieldname='round'
    )
    # Made at the first release: its events file is a write.
    self._tensorboard = None
    self.store = method.initial_store()
    self.server_state = None
    self.history = []
    self.next_round = 0
    self.saved_round = 0
    # `last_rounds` over [_last_rounds_from, rounds): right for any later
    # round (a user's last round from there on is the same).
    self._last_rounds_from = None
    self._last_rounds = None

  def _program_state(self):
    return collections.OrderedDict(
        next_round=np.int64(self.next_round),
        server_state=self.server_state,
        # The store's own arrays: saved (or used as the structure to load)
        # before it next changes, so no copy of gigabytes of client state.
        client_states=self.store.to_arrays(copy=False),
        history=json.dumps(self.history),
    )

  def _client_states_path(self) -> str:
    return os.path.join(self._root_dir, run_directory.CHECKPOINTS,
                        CLIENT_STATES_FILE)

  def _restore_from_disk(self, create: bool):
    """(the program state of the round the store's database last committed,
    its version), or (None, 0) for a new run, with the store on disk (a new
    database only if `create`).

    A checkpoint on disk is two writes: the program state's files (version
    r), then the database's commit of round r. A kill between them leaves
    version r without its commit: the run resumes from the round the
    database holds, whose files the manager still keeps (the last two)."""
    path = self._client_states_path()
    versions = asyncio.run(self._state_manager.get_versions())
    if not os.path.exists(path):
      if versions:
        raise ValueError(
            f'{self._root_dir} holds checkpoints but not the database of its '
            f'client states, {path}: without it they cannot resume. Restore '
            'the file, or start the run again in a new --root_dir.')
      if create:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.store.keep_on_disk(path, resume=False)
      return None, 0
    committed = self.store.keep_on_disk(path, resume=bool(versions))
    if not versions or not committed:
      return None, 0
    if committed not in versions:
      raise ValueError(
          f'The client states in {path} are those after round {committed}, '
          f'but {self._root_dir}/{run_directory.CHECKPOINTS} holds the '
          f'program state of rounds {versions} only: the run cannot resume. '
          'Start it again in a new --root_dir.')
    return asyncio.run(self._state_manager.load(
        committed, self._program_state())), committed

  def restore_or_initialize(self, *, create_client_states: bool = True
                            ) -> None:
    """Resumes from the latest checkpoint in root_dir, or starts fresh.
    `create_client_states=False` (a reader of the run, e.g. an export):
    a run on disk without the database of its client states yet gets
    none made; its store stays the initial one, in memory."""
    self.server_state = self.method.process.initialize()
    if self._config.client_store == 'disk':
      state, version = self._restore_from_disk(create_client_states)
    else:
      state, version = asyncio.run(
          self._state_manager.load_latest(self._program_state())
      )
      for problem in self._state_manager.passed_over:
        self._log(f'{problem} Passed over for the checkpoint before it.')
    if state is None:
      return
    self.next_round = self.saved_round = int(state['next_round'])
    # The loaded arrays map the checkpoint's files: copy what is kept.
    self.server_state = tf.nest.map_structure(np.array, state['server_state'])
    self.store.load_arrays(state['client_states'])
    history = state['history']
    self.history = json.loads(
        history.decode() if isinstance(history, bytes) else str(history)
    )
    self._log(
        f'Resumed from checkpoint {version}: {self.next_round} of '
        f'{self._config.rounds} rounds done.'
    )

  def evaluate(self) -> dict:
    """The protocol's evaluation of every user's model now."""
    return self.protocol.evaluate(self.method, self.server_state, self.store)

  def _plan_last_rounds(self, first_round: int) -> None:
    """Makes `round_input` mark users' last rounds from `first_round` on."""
    if self._last_rounds_from is None or first_round < self._last_rounds_from:
      self._last_rounds = last_rounds(
          self.protocol, range(first_round, self._config.rounds),
          self.protocol.data.num_users,
      )
      self._last_rounds_from = first_round

  def round_input(self, round_num: int) -> method_lib.RoundInput:
    """The protocol's input of round `round_num`, its users marked where it
    is their last round of the run (`RoundInput.last_round_users`)."""
    self._plan_last_rounds(round_num)
    round_input = self.protocol.round_input(round_num)
    return dataclasses.replace(
        round_input,
        last_round_users=(
            self._last_rounds[np.asarray(round_input.users)] == round_num),
    )

  def run_round(self, round_num: int, round_input=None,
                started: Optional[float] = None) -> dict:
    """Trains (and evaluates, when due) round `round_num` on
    `round_input` (None: `self.round_input`); returns its row,
    whose seconds count from `started` (a `time.perf_counter()`; None: the
    call), so a round whose input was drawn ahead counts the wait for it
    but not the drawing done while the previous round trained."""
    start = time.perf_counter() if started is None else started
    if round_input is None:
      round_input = self.round_input(round_num)
    result = self.method.run_round(
        self.server_state, self.store, round_input,
        users_per_client=self._config.users_per_client,
        cohort_size=cohorts.bounded_cohort_size(
            self._config.cohort_size, self.store.bytes_per_user(),
            self._config.cohort_state_bytes),
    )
    raise_if_diverged(
        round_num, result.metrics['train_loss'], result.server_state,
        self.saved_round,
    )
    self.server_state = result.server_state
    row = {'round': round_num, **result.metrics,
           'train_seconds': time.perf_counter() - start}
    last = round_num == self._config.rounds - 1
    if last or (round_num + 1) % self._config.eval_every == 0:
      row.update(self.evaluate())
    row['seconds'] = time.perf_counter() - start
    return row

  def _release(self, row: dict) -> None:
    value = scalar_fields(row)
    asyncio.run(self._csv.release(value, key=row['round']))
    if self._tensorboard is None:
      self._tensorboard = tff.program.TensorBoardReleaseManager(
          os.path.join(self._root_dir, 'tensorboard')
      )
    asyncio.run(self._tensorboard.release(value, key=row['round']))

  def train(self) -> dict:
    """Runs the remaining rounds; returns the summary (also summary.json)."""
    self.restore_or_initialize()
    rounds = range(self.next_round, self._config.rounds)
    # Planned here, so the thread drawing the inputs only reads the plan.
    self._plan_last_rounds(self.next_round)
    try:
      with contextlib.closing(one_ahead.one_ahead(
          (self.round_input(r) for r in rounds),
          thread_name='round-input')) as inputs:
        for round_num in rounds:
          started = time.perf_counter()
          self._train_round(round_num, next(inputs), started)
      return self.write_summary()
    finally:
      # On disk, what the last checkpoint did not commit is dropped: a run
      # made again (a restarted worker) resumes from it.
      self.store.close()

  def _train_round(self, round_num: int, round_input, started) -> None:
    """One round, its release and (when due) its checkpoint."""
    row = self.run_round(round_num, round_input, started)
    self.history.append(row)
    with interrupts.deferred():
      self._release(row)
      self.next_round = round_num + 1
      if (
          self.next_round % self._config.checkpoint_every == 0
          or self.next_round == self._config.rounds
      ):
        asyncio.run(self._state_manager.save(self._program_state(),
                                             self.next_round))
        # After the files: a database ahead of them could not resume.
        self.store.commit(self.next_round)
        self.saved_round = self.next_round
        run_peak_rss_mb(self._root_dir, self._worker_pid)
      self._log(self._progress_line(row))
    interrupts.raise_if_received()

  def _progress_line(self, row: dict) -> str:
    seconds = statistics.median(r['seconds'] for r in self.history)
    remaining = (self._config.rounds - self.next_round) * seconds
    evaluation = self.protocol.progress(row)
    return (
        f'round {row["round"] + 1:4d}/{self._config.rounds}  '
        f'loss {row["train_loss"]:.4f}  '
        + (f'{evaluation}  ' if evaluation else '')
        + f'{row["seconds"]:.2f}s (train {row["train_seconds"]:.2f}s)  '
        f'ETA {remaining:.0f}s'
    )

  def summary(self) -> dict:
    protocol_fields = self.protocol.summary(self.history)
    if self._paired_baseline is not None:
      protocol_fields['mdac'] = paired_runs.mdac_fields(
          protocol_fields['test']['per_tier'], self._paired_baseline,
          self.protocol.fairness_metric)
    return {
        **self._summary_fields,
        'rounds_completed': self.next_round,
        **protocol_fields,
        **self.method.summary_fields(
            self.server_state, self.store, self.history
        ),
        'seconds_per_round': statistics.median(
            row['seconds'] for row in self.history
        ),
        'train_seconds_per_round': statistics.median(
            row['train_seconds'] for row in self.history
        ),
        'peak_rss_mb': run_peak_rss_mb(self._root_dir, self._worker_pid),
        'num_users': self.protocol.data.num_users,
        'num_items': self.protocol.data.num_items,
    }

  def write_summary(self) -> dict:
    summary = self.summary()
    write_summary_json(self._root_dir, summary)
    return summary
