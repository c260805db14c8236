"""Program logic: federated training rounds with checkpoints and releases.

Per round r (0-based):
  1. sample the round's clients and draw their training negatives with an RNG
     seeded by (seed, r), so a resumed run draws exactly what an uninterrupted
     one would have drawn;
  2. run `process.next` on the clients' states and data (TFF);
  3. write the returned client states to the store;
  4. evaluate every user's own model on validation and test (1 + 99);
  5. release the metrics (CSV, TensorBoard) and save a checkpoint
     (server state, client-state store, round, metric history).

The report picks the round with the best validation HR@10 (the latest on ties,
as the reference code's `>=`) and reports test metrics at that round.
"""

import asyncio
import collections
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
from tff_fedrec import client_state_store
from tff_fedrec import evaluation
from tff_fedrec.algorithms import method as method_lib
from tff_fedrec.programs import numpy_program_state
from tff_fedrec.tasks import preprocessing

HISTORY_KEYS = (
    'round', 'train_loss', 'val_hr@10', 'val_ndcg@10', 'test_hr@10',
    'test_ndcg@10', 'test_auc', 'upload_bytes', 'download_bytes',
    'dense_upload_bytes', 'dense_download_bytes', 'message_download_bytes',
    'dense_message_download_bytes', 'train_seconds', 'seconds',
)


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """Round structure of a training run.

  Attributes:
    rounds: Total communication rounds.
    clients_per_round: Clients sampled each round (<= number of users).
    negatives_per_positive: Training negatives per positive, redrawn per round.
    seed: Seeds client sampling, negatives and shuffling.
    eval_every: Evaluate every this many rounds (and after the last one).
    checkpoint_every: Save program state every this many rounds.
    users_per_client: Users one TFF client simulates (`user_groups`).
  """

  rounds: int
  clients_per_round: int
  negatives_per_positive: int = 4
  seed: int = 0
  eval_every: int = 1
  checkpoint_every: int = 1
  users_per_client: int = 1

  def __post_init__(self):
    if self.users_per_client < 1:
      raise ValueError(
          f'users_per_client must be at least 1; got {self.users_per_client}.'
      )


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
  raise TrainingDivergedError(
      f'training diverged at round {round_num + 1}: {what}. That round was '
      f'not saved; the last checkpoint holds round {last_saved_round}. Lower '
      'the learning rates (--learning_rate, and --item_learning_rate or '
      '--user_learning_rate where the method has them) and run again: the '
      'same --root_dir resumes from that checkpoint, a new one starts over.'
  )


def _round_rng(seed: int, round_num: int) -> np.random.Generator:
  return np.random.default_rng([seed, round_num])


def sample_round(
    data: preprocessing.LeaveOneOutData,
    config: LoopConfig,
    round_num: int,
) -> tuple[
    np.ndarray, list[collections.OrderedDict], preprocessing.TrainingExamples
]:
  """The round's users (sorted), their client data (items, labels, seed)
  and every user's training examples of the round."""
  rng = _round_rng(config.seed, round_num)
  if config.clients_per_round >= data.num_users:
    users = np.arange(data.num_users)
  else:
    users = np.sort(
        rng.choice(data.num_users, config.clients_per_round, replace=False)
    )
  examples = preprocessing.sample_training_examples(
      train_offsets=data.train_offsets,
      train_items=data.train_items,
      interacted_offsets=data.interacted_offsets,
      interacted_items=data.interacted_items,
      num_items=data.num_items,
      negatives_per_positive=config.negatives_per_positive,
      rng=rng,
  )
  client_data = []
  for user in users:
    items, labels = preprocessing.user_examples(examples, user)
    client_data.append(
        collections.OrderedDict(
            items=items.astype(np.int32),
            labels=labels.astype(np.float32),
            seed=np.array([config.seed, round_num * data.num_users + user],
                          np.int64),
        )
    )
  return users, client_data, examples


def best_round(history: dict[str, list[float]]) -> int:
  """Index into history of the best validation HR@10 (latest on ties)."""
  values = history['val_hr@10']
  best = 0
  for index, value in enumerate(values):
    if value >= values[best]:
      best = index
  return best


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


def checkpoint_manager(
    root_dir: str,
) -> numpy_program_state.NumpyProgramStateManager:
  """The run's checkpoints, <root_dir>/checkpoints, keeping the last two
  (.npy files: TFF's SavedModel manager keeps a copy of large client state
  resident, see `numpy_program_state`)."""
  return numpy_program_state.NumpyProgramStateManager(
      os.path.join(root_dir, 'checkpoints'), keep_total=2
  )


def metrics_csv(root_dir: str) -> tff.program.CSVFileReleaseManager:
  """Per-round metrics released to <root_dir>/metrics.csv."""
  return tff.program.CSVFileReleaseManager(
      os.path.join(root_dir, 'metrics.csv'), key_fieldname='round'
  )


def write_summary_json(root_dir: str, summary: dict) -> None:
  """Writes <root_dir>/summary.json atomically (temporary file, rename)."""
  atomic_files.write_atomically(
      os.path.join(root_dir, 'summary.json'),
      json.dumps(summary, indent=2, sort_keys=True),
  )


class TrainingRun:
  """One training run of a `FederatedMethod` on leave-one-out data."""

  def __init__(
      self,
      method: method_lib.FederatedMethod,
      data: preprocessing.LeaveOneOutData,
      config: LoopConfig,
      root_dir: str,
      *,
      log: Callable[[str], None] = print,
      worker_pid: Optional[int] = None,
      summary_fields: Optional[dict] = None,
  ):
    self._method = method
    self._data = data
    self._config = config
    self._root_dir = root_dir
    self._log = log
    self._worker_pid = worker_pid
    self._summary_fields = dict(summary_fields or {})
    os.makedirs(root_dir, exist_ok=True)
    self._state_manager = checkpoint_manager(root_dir)
    self._csv = metrics_csv(root_dir)
    self._tensorboard = tff.program.TensorBoardReleaseManager(
        os.path.join(root_dir, 'tensorboard')
    )
    self.store = client_state_store.ClientStateStore(
        data.num_users, method.initial_client_state
    )
    self.server_state = None
    self.history = {key: [] for key in HISTORY_KEYS}
    self.next_round = 0
    self.saved_round = 0

  def _program_state(self):
    return collections.OrderedDict(
        next_round=np.int64(self.next_round),
        server_state=self.server_state,
        client_states=self.store.to_arrays(),
        history=collections.OrderedDict(
            (key.replace('@', '_at_'), np.asarray(values, np.float64))
            for key, values in self.history.items()
        ),
    )

  def restore_or_initialize(self) -> None:
    """Resumes from the latest checkpoint in root_dir, or starts fresh."""
    self.server_state = self._method.process.initialize()
    state, version = asyncio.run(
        self._state_manager.load_latest(self._program_state())
    )
    if state is None:
      return
    self.next_round = self.saved_round = int(state['next_round'])
    self.server_state = state['server_state']
    self.store.load_arrays(state['client_states'])
    for key in HISTORY_KEYS:
      self.history[key] = [
          float(v) for v in state['history'][key.replace('@', '_at_')]
      ]
    self._log(
        f'Resumed from checkpoint {version}: {self.next_round} of '
        f'{self._config.rounds} rounds done.'
    )

  def _evaluate(self, split: str) -> dict[str, float]:
    positives = getattr(self._data, f'{split}_items')
    negatives = getattr(self._data, f'{split}_negatives')
    return evaluation.evaluate_leave_one_out(
        self._method.spec,
        self._method.global_parameters(self.server_state),
        self.store,
        positives,
        negatives,
    )

  def run_round(self, round_num: int) -> dict[str, float]:
    start = time.perf_counter()
    users, client_data, examples = sample_round(
        self._data, self._config, round_num
    )
    result = self._method.run_round(
        self.server_state, self.store, users, client_data, examples,
        users_per_client=self._config.users_per_client,
    )
    self.server_state = result.server_state
    raise_if_diverged(
        round_num, result.train_loss, self.server_state, self.saved_round
    )
    # Methods that compress say what they moved and what the uncompressed
    # exchange would have; the others send their global parameters whole.
    download = getattr(result, 'download_bytes', None)
    if download is None:
      download = method_lib.parameter_bytes(
          self._method.initial_parameters, self._method.spec.global_keys
      ) * len(users)
    record = {
        'round': float(round_num),
        'train_loss': result.train_loss,
        'upload_bytes': float(result.upload_bytes),
        'download_bytes': float(download),
        'dense_upload_bytes': float(
            getattr(result, 'dense_upload_bytes', result.upload_bytes)
        ),
        'dense_download_bytes': float(
            getattr(result, 'dense_download_bytes', download)
        ),
        'message_download_bytes': float(
            getattr(result, 'message_download_bytes', download)
        ),
        'dense_message_download_bytes': float(
            getattr(result, 'dense_message_download_bytes', download)
        ),
        'train_seconds': time.perf_counter() - start,
    }
    last = round_num == self._config.rounds - 1
    if last or (round_num + 1) % self._config.eval_every == 0:
      val = self._evaluate('val')
      test = self._evaluate('test')
      record.update({
          'val_hr@10': val['hr@10'], 'val_ndcg@10': val['ndcg@10'],
          'test_hr@10': test['hr@10'], 'test_ndcg@10': test['ndcg@10'],
          'test_auc': test['auc'],
      })
    else:
      record.update({k: float('nan') for k in HISTORY_KEYS[2:7]})
    record['seconds'] = time.perf_counter() - start
    return record

  def _release(self, record: dict[str, float]) -> None:
    value = collections.OrderedDict(
        (k.replace('@', '_at_'), np.float64(v)) for k, v in record.items()
        if k != 'round'
    )
    key = int(record['round'])
    asyncio.run(self._csv.release(value, key=key))
    asyncio.run(self._tensorboard.release(value, key=key))

  def train(self) -> dict:
    """Runs the remaining rounds; returns the summary (also summary.json)."""
    self.restore_or_initialize()
    for round_num in range(self.next_round, self._config.rounds):
      record = self.run_round(round_num)
      for key in HISTORY_KEYS:
        self.history[key].append(record[key])
      self._release(record)
      self.next_round = round_num + 1
      if (
          self.next_round % self._config.checkpoint_every == 0
          or self.next_round == self._config.rounds
      ):
        asyncio.run(
            self._state_manager.save(self._program_state(), self.next_round)
        )
        self.saved_round = self.next_round
        run_peak_rss_mb(self._root_dir, self._worker_pid)
      self._log(self._progress_line(record))
    return self.write_summary()

  def _progress_line(self, record: dict[str, float]) -> str:
    seconds = statistics.median(self.history['seconds'])
    remaining = (self._config.rounds - self.next_round) * seconds
    return (
        f'round {int(record["round"]) + 1:4d}/{self._config.rounds}  '
        f'loss {record["train_loss"]:.4f}  '
        f'val HR@10 {record["val_hr@10"]:.4f}  '
        f'NDCG@10 {record["val_ndcg@10"]:.4f}  '
        f'{record["seconds"]:.2f}s (train {record["train_seconds"]:.2f}s)  '
        f'ETA {remaining:.0f}s'
    )

  def summary(self) -> dict:
    evaluated = [
        i for i, v in enumerate(self.history['val_hr@10']) if not np.isnan(v)
    ]
    history = {k: [self.history[k][i] for i in evaluated] for k in HISTORY_KEYS}
    best = best_round(history)
    return {
        **self._summary_fields,
        'rounds_completed': self.next_round,
        'best_round': int(history['round'][best]) + 1,
        'selection': 'test metrics at the round with the best validation HR@10',
        'validation': {
            'hr@10': history['val_hr@10'][best],
            'ndcg@10': history['val_ndcg@10'][best],
        },
        'test': {
            'hr@10': history['test_hr@10'][best],
            'ndcg@10': history['test_ndcg@10'][best],
            'auc': history['test_auc'][best],
        },
        'final_round_test': {
            'hr@10': history['test_hr@10'][-1],
            'ndcg@10': history['test_ndcg@10'][-1],
        },
        'seconds_per_round': statistics.median(self.history['seconds']),
        'train_seconds_per_round': statistics.median(
            self.history['train_seconds']
        ),
        'peak_rss_mb': run_peak_rss_mb(self._root_dir, self._worker_pid),
        'client_state_bytes_per_user': self.store.bytes_per_user(),
        'bytes_per_round': self.bytes_per_round(),
        'measured_compression_rate': self.measured_compression_rate(),
        'num_users': self._data.num_users,
        'num_items': self._data.num_items,
    }

  def bytes_per_round(self) -> dict[str, float]:
    """Bytes crossing the network per round (median over rounds), as the
    method's `run_round` measured them. Client state never leaves the
    device."""
    return {
        'download': statistics.median(self.history['download_bytes']),
        'upload': statistics.median(self.history['upload_bytes']),
    }

  def measured_compression_rate(self) -> dict[str, float]:
    """1 - bytes sent / bytes of the uncompressed exchange, over all
    rounds, each way (0 for methods that do not compress), and for the
    download also per message applied (`downlink_per_message`: without
    catch-up and resyncs; nan if no client applied a message)."""
    rates = {
        direction: 1.0 - sum(self.history[f'{key}_bytes'])
        / sum(self.history[f'dense_{key}_bytes'])
        for direction, key in (('uplink', 'upload'), ('downlink', 'download'),
                               ('downlink_per_message', 'message_download'))
        if sum(self.history[f'dense_{key}_bytes'])
    }
    rates.setdefault('downlink_per_message', float('nan'))
    return rates

  def write_summary(self) -> dict:
    summary = self.summary()
    write_summary_json(self._root_dir, summary)
    return summary
