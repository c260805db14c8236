"""The training program's flags and logic, shared by its two binaries.

`train` (`python -m tff_fedrec.programs.train`) trains a run from these
flags; `export` rebuilds a finished or checkpointed run from the flags it
saved (`run.flags`) to read its models. See train.py for the usage.
"""

import dataclasses
import os
import sys
from typing import Callable, Optional

# TensorFlow's C++ start-up notices would bury the progress lines.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app
from absl import flags
from absl import logging
import numpy as np

from tff_fedrec import atomic_files
from tff_fedrec import hetero_models
from tff_fedrec import tiers
from tff_fedrec.algorithms import hetefedrec
from tff_fedrec.algorithms import partially_local
from tff_fedrec.algorithms import registry
from tff_fedrec.programs import execution
from tff_fedrec.programs import hetero_training_loop
from tff_fedrec.programs import standalone_training_loop
from tff_fedrec.programs import training_loop
from tff_fedrec.tasks import datasets
from tff_fedrec.tasks import errors

_METHOD = flags.DEFINE_enum(
    'method', None, sorted(registry.ALL_METHODS),
    'Federated method to train.'
)
_DATASET = flags.DEFINE_enum(
    'dataset', None, list(datasets.NAMED_DATASETS),
    'Named data set. Without it, --data_path loads a local interactions file.',
)
_DATA_PATH = flags.DEFINE_string(
    'data_path', None,
    'Local interactions file (user,item,rating,timestamp). Alone it is the '
    'data set; with --dataset=ml-100k/ml-1m it replaces the download.',
)
_SEPARATOR = flags.DEFINE_string(
    'separator', ',', 'Field separator of --data_path (e.g. "::" or "\\t").'
)
_HEADER = flags.DEFINE_enum(
    'header', 'auto', ['auto', 'true', 'false'], 'Header line in --data_path.'
)
_MIN_INTERACTIONS = flags.DEFINE_integer(
    'min_interactions', 0,
    'Drop users with fewer interactions (the paper uses 5 for Lastfm-2K and '
    'Amazon-Video; leave-one-out needs at least 3).',
)
_SYNTHETIC_USERS = flags.DEFINE_integer(
    'synthetic_users', 200, 'Users of --dataset=synthetic.'
)
_SYNTHETIC_ITEMS = flags.DEFINE_integer(
    'synthetic_items', 500, 'Items of --dataset=synthetic.'
)
_ROUNDS = flags.DEFINE_integer('rounds', 100, 'Communication rounds.')
_CLIENTS_PER_ROUND = flags.DEFINE_integer(
    'clients_per_round', None,
    'Clients per round (default: all users, as in the paper).',
)
_CLIENT_FRACTION = flags.DEFINE_float(
    'client_fraction', None, 'Fraction of users per round (alternative to '
    '--clients_per_round).',
)
_USERS_PER_TFF_CLIENT = flags.DEFINE_integer(
    'users_per_tff_client', 32,
    'Users one TFF client simulates at once (tff_fedrec.algorithms.'
    'user_groups). Results do not depend on it; larger groups share TFF\'s '
    'per-client cost. 1 = one TFF client per user. fedrecon always uses 1.',
)
_LOCAL_EPOCHS = flags.DEFINE_integer('local_epochs', 1, 'Local epochs E.')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 256, 'Local batch size B.')
_LEARNING_RATE = flags.DEFINE_float(
    'learning_rate', None, 'SGD learning rate of score functions and user '
    'embeddings (default 0.1; fedncf\'s shared MLP trains far better at 3, '
    'its preset\'s value); for the tiered methods (hetefedrec and its '
    'baselines) Adam\'s learning rate of every public parameter (default '
    '0.01; HeteFedRec Sec. V.D\'s 0.001 leaves every model a popularity '
    'ranker, see the README).',
)
_ITEM_LEARNING_RATE = flags.DEFINE_float(
    'item_learning_rate', None,
    'SGD learning rate of item embedding rows. Default: learning_rate * '
    'num_items * item_lr_eta, the reference code\'s choice (13,456 on ML-100K).',
)
_ITEM_LR_ETA = flags.DEFINE_float(
    'item_lr_eta', 80.0, 'eta of the default --item_learning_rate.'
)
_EMBEDDING_DIM = flags.DEFINE_integer('embedding_dim', 32, 'Embedding size.')
_HIDDEN_UNITS = flags.DEFINE_list(
    'hidden_units', [],
    'Hidden layers of the score function (PFedRec: empty = one dense layer, '
    'as in the paper) or of the NCF MLP (empty = 32,16,8).',
)
_NEGATIVES = flags.DEFINE_integer(
    'num_negatives', 4, 'Training negatives per positive, redrawn each round.'
)
_EVAL_NEGATIVES = flags.DEFINE_integer(
    'num_eval_negatives', 99, 'Sampled negatives per validation/test item.'
)
_DUAL_PERSONALIZATION = flags.DEFINE_bool(
    'dual_personalization', None,
    'Add PFedRec\'s dual personalization to fedmf / fedncf (Table 3). '
    'pfedrec always has it.',
)
_LDP_NOISE = flags.DEFINE_float(
    'ldp_noise_scale', 0.0,
    'Laplace noise scale lambda on uploaded item embeddings (Sec. 6.6).',
)
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of everything random.')
_ROOT_DIR = flags.DEFINE_string(
    'root_dir', None, 'Output directory (checkpoints, metrics, summary.json).'
)
_CACHE_DIR = flags.DEFINE_string(
    'cache_dir', None, 'Download cache (default $TFF_FEDREC_CACHE or '
    '~/.cache/tff_fedrec).',
)
_EVAL_EVERY = flags.DEFINE_integer(
    'eval_every', None,
    'Evaluate every N rounds (default 1; for the tiered methods one epoch of '
    'the client queue).',
)
_TIER_RATIO = flags.DEFINE_list(
    'tier_ratio', ['5', '3', '2'],
    'Tiered methods (and FedRAS with --tier_compression_rates): '
    'small:medium:large shares of users by training data size (HeteFedRec '
    'Table VI: 5,3,2 / 1,1,1 / 2,3,5).',
)
_TIER_WIDTHS = flags.DEFINE_list(
    'tier_widths', ['8', '16', '32'],
    'Tiered methods: item-embedding sizes N_s,N_m,N_l (Table VII: 2,4,8 / '
    '8,16,32 / 32,64,128).',
)
_MODEL = flags.DEFINE_enum(
    'model', None, ['mf', 'ncf', 'lightgcn'],
    'Tiered methods: base model, ncf (default) or lightgcn (one propagation '
    'layer on each user\'s local graph). FedRAS and its baselines: mf '
    '(default) or ncf.',
)
_NEIGHBOR_GRADIENT = flags.DEFINE_bool(
    'lightgcn_neighbor_gradient', True,
    'Tiered methods with --model=lightgcn: whether item vectors also learn '
    'through the user vectors they are propagated into (plain autodiff). '
    '--nolightgcn_neighbor_gradient stops that gradient; see the README, '
    'Fed-LightGCN.',
)
_COMPRESSION_RATE = flags.DEFINE_float(
    'compression_rate', 0.9375,
    'FedRAS and its baselines: the requested share of bytes saved, 1 - '
    'compressed / dense (Sec. 5.1).',
)
_ALPHA = flags.DEFINE_float(
    'alpha', 0.2, 'FedRAS: the fluctuation factor of cluster-and-split '
    '(Sec. 4.3); fedras_f sets it to 0.',
)
_COMPRESSION_RATE_RANGE = flags.DEFINE_list(
    'compression_rate_range', [],
    'FedRAS: LOW,HIGH; each user draws its own rate, hence its bandwidth '
    '(Sec. 5.5, Table 4).',
)
_TIER_COMPRESSION_RATES = flags.DEFINE_list(
    'tier_compression_rates', [],
    'FedRAS: SMALL,MEDIUM,LARGE, a requested rate per tier. Users are split '
    'into tiers by training interactions with --tier_ratio (fewest first), '
    'and each user\'s bandwidth e_u follows its tier\'s rate, e.g. '
    '0.97,0.9375,0.8.',
)
_CATCH_UP_ROUNDS = flags.DEFINE_integer(
    'catch_up_rounds', 32,
    'FedRAS and the codec baselines: rounds of downlink messages the server '
    'keeps for clients that missed rounds; beyond that a client downloads '
    'the whole table.',
)
_RESYNC_WHEN_CHEAPER = flags.DEFINE_bool(
    'resync_when_cheaper', True,
    'FedRAS and the codec baselines: a returning client downloads the whole '
    'table when the messages it missed would cost more bytes. '
    '--noresync_when_cheaper applies every message within --catch_up_rounds '
    '(Algorithm 1 sends one message a round).',
)
_USER_OPTIMIZER = flags.DEFINE_enum(
    'user_optimizer', 'sgd', ['sgd', 'adam'],
    'Tiered methods: how a client moves its private user embedding: sgd is '
    'HeteFedRec\'s Eq. 3; adam keeps Adam moments in the client state.',
)
_USER_LR = flags.DEFINE_float(
    'user_learning_rate', 0.001,
    'Tiered methods: learning rate of the private user embedding.',
)
_UPDATE_RULE = flags.DEFINE_enum(
    'update_rule', 'server_adam', ['server_adam', 'local_adam'],
    'Tiered methods: server_adam: each client uploads one gradient of its '
    'data and the server takes an Adam step on their sum (default); '
    'local_adam: each client trains --local_epochs epochs of Adam (full '
    'batch, or --local_batch_size) from fresh moments (step '
    '--learning_rate, its user embedding included) and the server adds '
    'the sum of the clients\' changes '
    '(HeteFedRec Eq. 4, 8, 9, 15 with the step taken on the clients).',
)
_LOCAL_VALIDATION = flags.DEFINE_float(
    'local_validation_fraction', 0.0,
    'Tiered methods with --update_rule=local_adam: the share of a selected '
    'client\'s examples held out, drawn every round, to guide its local '
    'training (HeteFedRec Sec. V.A: 0.1): the client keeps its local epoch '
    'of lowest held-out loss. 0 trains on everything and keeps the last.',
)
_LOCAL_BATCH_SIZE = flags.DEFINE_integer(
    'local_batch_size', 0,
    'Tiered methods with --update_rule=local_adam: 0 makes a local epoch '
    'one full-batch step; B > 0 makes it a pass of Adam steps on batches of '
    'B of the client\'s examples in a fresh random order (the first '
    'author\'s public FedRec code uses 64 or 256). --batch_size is the '
    'leave-one-out methods\'.',
)
_TRAINING_NEGATIVES = flags.DEFINE_enum(
    'training_negatives', 'per_round', ['per_round', 'once'],
    'Tiered methods: per_round redraws a user\'s --num_negatives negatives '
    'per positive every round it is selected; once draws them once for '
    'the run (as the first author\'s public FedRec code does).',
)
_CHANGE_AGGREGATION = flags.DEFINE_enum(
    'change_aggregation', 'sum', ['sum', 'mean', 'fedavg'],
    'Tiered methods with --update_rule=local_adam: sum: the server adds '
    'the clients\' changes (Eq. 4, 8, 15 as written); mean: each '
    'parameter moves by the mean change of the clients that trained it; '
    'fedavg: FedAvg of whole models, each item row by its summed change '
    'over all the round\'s clients holding it (trained or not).',
)
_DUAL_TASK = flags.DEFINE_bool(
    'dual_task', True, 'hetefedrec: unified dual-task learning (Eq. 11).'
)
_DECORRELATION_WEIGHT = flags.DEFINE_float(
    'decorrelation_weight', 1.0,
    'hetefedrec: alpha of the decorrelation regulariser (Eq. 14); 0 = off.',
)
_DISTILLATION_ITEMS = flags.DEFINE_integer(
    'distillation_items', 256,
    'hetefedrec: items in each round\'s distillation subset (Eq. 16); 0 = off.',
)
_DISTILLATION_LR = flags.DEFINE_float(
    'distillation_learning_rate', 0.001,
    'hetefedrec: gradient step of the distillation loss (Eq. 17).',
)
_CHECKPOINT_EVERY = flags.DEFINE_integer(
    'checkpoint_every', 1, 'Checkpoint every N rounds.'
)
_MAX_WORKER_RESTARTS = flags.DEFINE_integer(
    'max_worker_restarts', 3,
    'If the TFF worker dies, restart it and resume from the last checkpoint '
    'this many times before giving up.',
)
_EXECUTOR = flags.DEFINE_enum(
    'executor', 'local', ['local', 'remote'],
    'local: a TFF worker this program starts and owns. remote: the TFF '
    'workers of --workers (start each with `python -m '
    'tff_fedrec.programs.worker --port=PORT`); each round\'s clients are '
    'split among them.',
)
_WORKERS = flags.DEFINE_list(
    'workers', [], 'HOST:PORT of each TFF worker for --executor=remote.'
)
_WORKER_TIMEOUT = flags.DEFINE_float(
    'worker_timeout_seconds', 60.0,
    'How long a --workers worker may take to answer at the start, and (a '
    'tenth of it, at least 5 s) stay unreachable during a run, before the '
    'run stops with an error naming it.',
)
_ALLOW_INSECURE_REMOTE = flags.DEFINE_bool(
    'allow_insecure_remote', False,
    'Accept worker addresses off this machine. TFF workers have no '
    'authentication or TLS.',
)


RUN_FLAGS_FILE = 'run.flags'


class FlagError(ValueError):
  """Inconsistent or missing flags."""


def _data_config() -> datasets.DataConfig:
  dataset = _DATASET.value
  if dataset is None:
    if not _DATA_PATH.value:
      raise FlagError(
          'Give --dataset=ml-100k|ml-1m|synthetic, or --data_path=FILE for a '
          'local interactions file.'
      )
    dataset = 'file'
  elif dataset == 'synthetic' and _DATA_PATH.value:
    raise FlagError('--data_path cannot be combined with --dataset=synthetic.')
  header = {'auto': 'auto', 'true': True, 'false': False}[_HEADER.value]
  return datasets.DataConfig(
      dataset=dataset,
      data_path=_DATA_PATH.value,
      separator=_SEPARATOR.value.encode().decode('unicode_escape'),
      header=header,
      cache_dir=_CACHE_DIR.value,
      synthetic_users=_SYNTHETIC_USERS.value,
      synthetic_items=_SYNTHETIC_ITEMS.value,
      min_interactions_per_user=_MIN_INTERACTIONS.value,
      seed=_SEED.value,
  )


def _sgd_learning_rate() -> float:
  return 0.1 if _LEARNING_RATE.value is None else _LEARNING_RATE.value


def _clients_per_round(num_users: int) -> int:
  if _CLIENTS_PER_ROUND.value is not None and _CLIENT_FRACTION.value is not None:
    raise FlagError('Give --clients_per_round or --client_fraction, not both.')
  if _CLIENT_FRACTION.value is not None:
    if not 0 < _CLIENT_FRACTION.value <= 1:
      raise FlagError('--client_fraction must be in (0, 1].')
    return max(1, int(num_users * _CLIENT_FRACTION.value))
  if _CLIENTS_PER_ROUND.value is None:
    return num_users
  if not 1 <= _CLIENTS_PER_ROUND.value <= num_users:
    raise FlagError(
        f'--clients_per_round must be in [1, {num_users}] (the number of '
        f'users); got {_CLIENTS_PER_ROUND.value}.'
    )
  return _CLIENTS_PER_ROUND.value


def _training_config(num_items: int) -> partially_local.ClientTrainingConfig:
  method = _METHOD.value
  dual = _DUAL_PERSONALIZATION.value
  if dual is None:
    dual = method in registry.ALWAYS_DUAL_PERSONALIZED
  item_lr = _ITEM_LEARNING_RATE.value
  if item_lr is None:
    item_lr = _sgd_learning_rate() * num_items * _ITEM_LR_ETA.value
  for name, value in [('rounds', _ROUNDS.value), ('local_epochs', _LOCAL_EPOCHS.value),
                      ('batch_size', _BATCH_SIZE.value),
                      ('embedding_dim', _EMBEDDING_DIM.value),
                      ('users_per_tff_client', _USERS_PER_TFF_CLIENT.value)]:
    if value < 1:
      raise FlagError(f'--{name} must be at least 1; got {value}.')
  return partially_local.ClientTrainingConfig(
      learning_rate=_sgd_learning_rate(),
      item_learning_rate=item_lr,
      batch_size=_BATCH_SIZE.value,
      local_epochs=_LOCAL_EPOCHS.value,
      dual_personalization=dual,
      ldp_noise_scale=_LDP_NOISE.value,
  )


def _results_table(summary: dict) -> str:
  test, val = summary['test'], summary['validation']
  rows = [
      ('method', summary['method']),
      ('dataset', summary['dataset']),
      ('rounds completed', summary['rounds_completed']),
      ('best round (by validation HR@10)', summary['best_round']),
      ('validation HR@10 / NDCG@10', f'{val["hr@10"]:.4f} / {val["ndcg@10"]:.4f}'),
      ('test HR@10 / NDCG@10 at best round', f'{test["hr@10"]:.4f} / {test["ndcg@10"]:.4f}'),
      ('test AUC at best round', f'{test["auc"]:.4f}'),
      ('seconds per round (median)', f'{summary["seconds_per_round"]:.2f}'),
      ('peak RSS (program + TFF worker)', f'{summary["peak_rss_mb"]:.0f} MB'),
      ('client state per user', f'{summary["client_state_bytes_per_user"] / 1024:.1f} KiB'),
  ]
  sent, rate = summary['bytes_per_round'], summary['measured_compression_rate']
  rows.append((
      'bytes per round up / down (median)',
      f'{sent["upload"] / 1e6:.3f} / {sent["download"] / 1e6:.3f} MB; '
      f'measured compression {rate["uplink"]:.4f} / {rate["downlink"]:.4f} '
      f'(downlink per message {rate["downlink_per_message"]:.4f})',
  ))
  width = max(len(name) for name, _ in rows)
  return '\n'.join(f'{name:<{width}}  {value}' for name, value in rows)


def _remote_workers() -> list[str]:
  """--workers, checked; empty for --executor=local."""
  if _EXECUTOR.value == 'local':
    if _WORKERS.value:
      raise FlagError('--workers needs --executor=remote.')
    return []
  return execution.parse_worker_addresses(
      _WORKERS.value, allow_insecure_remote=_ALLOW_INSECURE_REMOTE.value
  )


def _executor_summary() -> dict:
  """Where the computations ran; with remote workers, `peak_rss_mb` is the
  program's alone."""
  return {'kind': _EXECUTOR.value, 'workers': _remote_workers()}


def _train_with_worker_restarts(
    root_dir: str, train: Callable[[Optional[int]], dict]
):
  """Runs `train(worker_pid)` on a TFF worker of its own; if the worker
  dies, restarts it and calls `train` again (which resumes from the last
  checkpoint), at most --max_worker_restarts times.

  With --executor=remote, runs `train(None)` on the --workers instead; they
  are not ours to restart, so a worker that stops answering ends the run
  with `WorkerDiedError` (the last checkpoint stays intact)."""
  workers = _remote_workers()
  if workers:
    print(f'TFF workers: {", ".join(workers)}.', flush=True)
    with execution.remote_workers_context(
        workers,
        ready_timeout_seconds=_WORKER_TIMEOUT.value,
        unreachable_seconds=max(5.0, _WORKER_TIMEOUT.value / 10),
    ):
      return train(None)
  restarts = 0
  while True:
    try:
      with execution.worker_execution_context(
          log_path=os.path.join(root_dir, 'worker.log')
      ) as worker_pid:
        return train(worker_pid)
    except execution.WorkerDiedError as error:
      if restarts >= _MAX_WORKER_RESTARTS.value:
        raise
      restarts += 1
      print(
          f'{error} Restarting it and resuming from the last checkpoint '
          f'(restart {restarts} of at most {_MAX_WORKER_RESTARTS.value}).',
          flush=True,
      )


def _int_list(name: str, values: list[str]) -> tuple[int, ...]:
  try:
    parsed = tuple(int(v) for v in values)
  except ValueError:
    raise FlagError(f'--{name} takes comma-separated integers; got {values}.')
  if len(parsed) != 3:
    raise FlagError(f'--{name} needs 3 values (small, medium, large).')
  return parsed


def _hetero_results_table(summary: dict) -> str:
  test = summary['test']
  rows = [
      ('method', summary['method']),
      ('dataset', summary['dataset']),
      ('rounds completed', summary['rounds_completed']),
      ('test Recall@20 / NDCG@20 (last round)',
       f'{test["recall@20"]:.5f} / {test["ndcg@20"]:.5f}'),
  ]
  if test.get('tied_users'):
    rows.append((
        'users whose model scores every item the same',
        f'{test["tied_users"]} (collapsed; ranked by item index)',
    ))
  for name, tier in test['per_tier'].items():
    sent = summary['bytes_per_client'][name]
    rows.append((
        f'  {name} ({tier["users"]} users)',
        f'{tier["recall@20"]:.5f} / {tier["ndcg@20"]:.5f}; per client '
        f'{sent["download"] / 1024:.1f} KiB down, '
        f'{sent["upload"] / 1024:.1f} KiB up',
    ))
  rows += [
      ('seconds per round (median)', f'{summary["seconds_per_round"]:.2f}'),
      ('peak RSS (program + TFF worker)', f'{summary["peak_rss_mb"]:.0f} MB'),
  ]
  if summary['singular_value_variance_large'] is not None:
    rows.append(('singular-value variance of V_l (Table V)',
                 f'{summary["singular_value_variance_large"]:.4g}'))
  width = max(len(name) for name, _ in rows)
  return '\n'.join(f'{name:<{width}}  {value}' for name, value in rows)


@dataclasses.dataclass(frozen=True)
class PreparedRun:
  """A run built from the flags, before any round: what `run` trains and
  what `export` reads checkpoints with.

  Attributes:
    method_name: --method.
    tiered: Whether the method is a HeteFedRec-family (tiered) one.
    data: The loaded data (leave-one-out or random split).
    method: The built method.
    root_dir: --root_dir.
    make_training_run: worker_pid -> the program logic object
      (`training_loop.TrainingRun` or `hetero_training_loop.HeteroTrainingRun`).
    results_table: summary -> the printed table.
  """

  method_name: str
  tiered: bool
  data: object
  method: object
  root_dir: str
  make_training_run: Callable[[Optional[int]], object]
  results_table: Callable[[dict], str]


# Flags of the leave-one-out methods that the tiered methods have no use
# for; a tiered run refuses them rather than ignore them (run.flags files
# list every flag at its default, so the test is the value, not presence).
_NOT_TIERED_FLAGS = (
    _LOCAL_EPOCHS, _BATCH_SIZE, _EMBEDDING_DIM, _ITEM_LEARNING_RATE,
    _ITEM_LR_ETA, _EVAL_NEGATIVES, _DUAL_PERSONALIZATION, _LDP_NOISE,
    _COMPRESSION_RATE, _ALPHA, _COMPRESSION_RATE_RANGE,
    _TIER_COMPRESSION_RATES, _CATCH_UP_ROUNDS, _RESYNC_WHEN_CHEAPER,
)


def _changed_flags(holders) -> list:
  """The flags among `holders` given a value other than their default."""
  return [h for h in holders if h.value != flags.FLAGS[h.name].default]


def _check_tiered_flags() -> None:
  local_adam = _UPDATE_RULE.value == 'local_adam'
  if local_adam and _METHOD.value == 'standalone':
    raise FlagError(
        '--update_rule=local_adam does not apply to --method=standalone: its '
        'clients keep their whole model and Adam state on the device. Drop '
        'the flag.'
    )
  if local_adam:
    for holder in _changed_flags((_USER_OPTIMIZER, _USER_LR)):
      raise FlagError(
          f'--{holder.name} does not apply to --update_rule=local_adam: the '
          'user embedding trains with the local Adam (--learning_rate). '
          'Drop the flag.'
      )
  else:
    for holder in _changed_flags(
        (_LOCAL_VALIDATION, _CHANGE_AGGREGATION, _LOCAL_BATCH_SIZE)):
      raise FlagError(
          f'--{holder.name} needs --update_rule=local_adam: under '
          'server_adam a client takes no local steps and the server '
          'aggregates gradients. Add --update_rule=local_adam or drop the '
          'flag.'
      )
  if _LOCAL_BATCH_SIZE.value < 0:
    raise FlagError(
        '--local_batch_size must be >= 0 (0: one full-batch step per local '
        f'epoch); got {_LOCAL_BATCH_SIZE.value}.'
    )
  if not 0.0 <= _LOCAL_VALIDATION.value < 1.0:
    raise FlagError(
        '--local_validation_fraction must be in [0, 1) (the paper holds '
        f'out 0.1); got {_LOCAL_VALIDATION.value}.'
    )
  for holder in _changed_flags(_NOT_TIERED_FLAGS):
    if not (local_adam and holder is _LOCAL_EPOCHS):
      raise FlagError(
          f'--{holder.name} does not apply to --method={_METHOD.value}: a '
          'tiered client takes one gradient of its whole data per round '
          '(HeteFedRec Algorithm 1; --local_epochs needs '
          '--update_rule=local_adam) with item tables as wide as '
          '--tier_widths, scored by full ranking. Drop the flag.'
      )


def _prepare_tiered(data_config, summary_fields):
  """The tiered methods: random split, tiers, full ranking (HeteFedRec)."""
  _check_tiered_flags()
  data = datasets.load_random_split(data_config)
  widths = _int_list('tier_widths', _TIER_WIDTHS.value)
  ratio = _int_list('tier_ratio', _TIER_RATIO.value)
  if _HIDDEN_UNITS.value:
    hidden_units = tuple(int(u) for u in _HIDDEN_UNITS.value)
  else:
    hidden_units = (8, 8)
  model = _MODEL.value or 'ncf'
  if model == 'mf':
    raise FlagError('Tiered methods take --model=ncf or --model=lightgcn.')
  if not _NEIGHBOR_GRADIENT.value and model != 'lightgcn':
    raise FlagError(
        '--nolightgcn_neighbor_gradient applies to --model=lightgcn only.'
    )
  spec = hetero_models.HeteroSpec(
      num_items=data.num_items, widths=widths, hidden_units=hidden_units,
      model=model, neighbor_gradient=_NEIGHBOR_GRADIENT.value,
  )
  config = hetefedrec.HeteroConfig(
      learning_rate=(
          hetefedrec.HeteroConfig.learning_rate
          if _LEARNING_RATE.value is None else _LEARNING_RATE.value
      ),
      dual_task=_DUAL_TASK.value,
      decorrelation_weight=_DECORRELATION_WEIGHT.value,
      distillation_items=_DISTILLATION_ITEMS.value,
      distillation_learning_rate=_DISTILLATION_LR.value,
      user_optimizer=_USER_OPTIMIZER.value,
      user_learning_rate=_USER_LR.value,
      update_rule=_UPDATE_RULE.value,
      local_epochs=_LOCAL_EPOCHS.value,  # Not 1 only with local_adam.
      local_batch_size=_LOCAL_BATCH_SIZE.value,
      validation_fraction=_LOCAL_VALIDATION.value,
      change_aggregation=_CHANGE_AGGREGATION.value,
      seed=_SEED.value,
  )
  if _CLIENTS_PER_ROUND.value is None and _CLIENT_FRACTION.value is None:
    clients_per_round = min(256, data.num_users)
  else:
    clients_per_round = _clients_per_round(data.num_users)
  rounds_per_epoch = -(-data.num_users // clients_per_round)
  loop_config = hetero_training_loop.HeteroLoopConfig(
      rounds=_ROUNDS.value,
      clients_per_round=clients_per_round,
      tier_ratio=ratio,
      negatives_per_positive=_NEGATIVES.value,
      training_negatives=_TRAINING_NEGATIVES.value,
      seed=_SEED.value,
      eval_every=_EVAL_EVERY.value or rounds_per_epoch,
      users_per_client=_USERS_PER_TFF_CLIENT.value,
      checkpoint_every=_CHECKPOINT_EVERY.value,
  )
  method = registry.get_builder(_METHOD.value)(
      spec=spec, config=config, seed=_SEED.value
  )
  description = (
      f'{data.num_items} items, {clients_per_round} clients per round '
      f'({rounds_per_epoch} rounds per epoch), tiers {ratio}, widths '
      f'{widths}.'
  )
  summary_fields['config'] = {
      'method': dataclasses.asdict(method.config),
      'loop': dataclasses.asdict(loop_config),
      'model': model,
      'widths': list(widths),
      'hidden_units': list(hidden_units),
      'model_tier': list(method.model_tier),
      'included': list(method.included),
  }
  if method.personal_models:
    run_class = standalone_training_loop.StandaloneTrainingRun
  else:
    run_class = hetero_training_loop.HeteroTrainingRun
  return data, method, loop_config, run_class, description


# Flags of the tiered methods alone; the other methods refuse them rather
# than ignore them (--tier_ratio also sets FedRAS's tiers).
_TIERED_ONLY_FLAGS = (
    _TIER_WIDTHS, _NEIGHBOR_GRADIENT, _USER_OPTIMIZER, _USER_LR,
    _UPDATE_RULE, _DUAL_TASK, _DECORRELATION_WEIGHT, _DISTILLATION_ITEMS,
    _DISTILLATION_LR, _LOCAL_VALIDATION, _CHANGE_AGGREGATION,
    _LOCAL_BATCH_SIZE, _TRAINING_NEGATIVES,
)


def _check_leave_one_out_flags() -> None:
  for holder in _changed_flags(_TIERED_ONLY_FLAGS):
    raise FlagError(
        f'--{holder.name} applies to the tiered methods (hetefedrec and its '
        f'baselines), not to --method={_METHOD.value}. Drop the flag.'
    )


def _prepare_leave_one_out(data_config, summary_fields):
  """PFedRec's protocol: leave-one-out, 1 + 99 ranking."""
  _check_leave_one_out_flags()
  data = datasets.load_leave_one_out(
      data_config, num_eval_negatives=_EVAL_NEGATIVES.value
  )
  training = _training_config(data.num_items)
  loop_config = training_loop.LoopConfig(
      rounds=_ROUNDS.value,
      clients_per_round=_clients_per_round(data.num_users),
      negatives_per_positive=_NEGATIVES.value,
      seed=_SEED.value,
      eval_every=_EVAL_EVERY.value or 1,
      checkpoint_every=_CHECKPOINT_EVERY.value,
      users_per_client=_USERS_PER_TFF_CLIENT.value,
  )
  compression = _compression_arguments(np.diff(data.train_offsets))
  method = registry.get_builder(_METHOD.value)(
      num_items=data.num_items,
      embedding_dim=_EMBEDDING_DIM.value,
      hidden_units=tuple(int(u) for u in _HIDDEN_UNITS.value),
      training=training,
      seed=_SEED.value,
      model_aggregator=None,
      **compression,
  )
  description = (
      f'{data.num_items} items, {loop_config.clients_per_round} clients per '
      f'round; item learning rate {training.item_learning_rate:g}.'
  )
  summary_fields['config'] = {
      'training': dataclasses.asdict(training),
      'loop': dataclasses.asdict(loop_config),
      'embedding_dim': _EMBEDDING_DIM.value,
      'hidden_units': list(method.spec.hidden_units),
  }
  if compression:
    summary_fields['config']['compression'] = {
        key: value for key, value in compression.items()
        if key != 'user_compression_rates'
    }
  if 'user_compression_rates' in compression:
    users_per_rate, line = _tier_bandwidths(
        compression['user_compression_rates'], method.bandwidths
    )
    summary_fields['config']['compression']['users_per_tier_rate'] = (
        users_per_rate
    )
    description += ' ' + line
  return data, method, loop_config, training_loop.TrainingRun, description


def _tier_bandwidths(user_rates: np.ndarray, bandwidths) -> tuple[dict, str]:
  """({rate: users}, a log line with each tier rate's e_u) of the users'
  rates from --tier_compression_rates."""
  users_per_rate, parts = {}, []
  for rate in sorted(set(user_rates.tolist()), reverse=True):
    users = np.flatnonzero(user_rates == rate)
    users_per_rate[f'{rate:g}'] = len(users)
    parts.append(
        f'rate {rate:g} -> {bandwidths(users[:1])[0]} rows ({len(users)} '
        'users)'
    )
  return users_per_rate, 'Bandwidths e_u per tier: ' + ', '.join(parts) + '.'


def _compression_arguments(train_counts: np.ndarray) -> dict:
  """The extra builder arguments of FedRAS and its baselines;
  `train_counts` [U] (each user's training interactions) places users in
  the tiers of --tier_compression_rates."""
  method = _METHOD.value
  if method not in registry.COMPRESSED_METHODS:
    if _MODEL.value is not None and method not in registry.HETERO_METHODS:
      raise FlagError(
          f'--model applies to tiered and compressed methods, not {method} '
          '(fedmf / fedncf name their model).'
      )
    return {}
  model = _MODEL.value or 'mf'
  if model not in ('mf', 'ncf'):
    raise FlagError(f'{method} takes --model=mf or --model=ncf.')
  if not 0 <= _COMPRESSION_RATE.value < 1:
    raise FlagError(
        '--compression_rate must be in [0, 1); 0 is the least compression '
        'the format allows (Table 4\'s "Excellent").'
    )
  arguments = {'model': model, 'compression_rate': _COMPRESSION_RATE.value}
  if method != 'base_small_dim':
    arguments['catch_up_rounds'] = _CATCH_UP_ROUNDS.value
    arguments['resync_when_cheaper'] = _RESYNC_WHEN_CHEAPER.value
  if method.startswith('fedras'):
    arguments['alpha'] = _ALPHA.value
    if _COMPRESSION_RATE_RANGE.value:
      try:
        low, high = (float(v) for v in _COMPRESSION_RATE_RANGE.value)
      except ValueError:
        raise FlagError(
            '--compression_rate_range takes LOW,HIGH, e.g. 0.9,0.97.'
        ) from None
      arguments['compression_rate_range'] = (low, high)
    if _TIER_COMPRESSION_RATES.value:
      arguments['user_compression_rates'] = _tier_compression_rates(
          train_counts
      )
  elif _COMPRESSION_RATE_RANGE.value or _TIER_COMPRESSION_RATES.value:
    raise FlagError(
        '--compression_rate_range and --tier_compression_rates apply to '
        'fedras only (the baselines give every client one rate, Sec. 5.1).'
    )
  return arguments


def _tier_compression_rates(train_counts: np.ndarray) -> np.ndarray:
  """float [U]: each user's rate from --tier_compression_rates, its tier
  by training interactions and --tier_ratio (`tiers`)."""
  if _COMPRESSION_RATE_RANGE.value:
    raise FlagError(
        '--tier_compression_rates and --compression_rate_range both set '
        'per-user bandwidths; give one of them.'
    )
  try:
    rates = np.asarray(
        [float(v) for v in _TIER_COMPRESSION_RATES.value], np.float64
    )
  except ValueError:
    raise FlagError(
        '--tier_compression_rates takes SMALL,MEDIUM,LARGE rates, e.g. '
        f'0.97,0.9375,0.8; got {_TIER_COMPRESSION_RATES.value}.'
    ) from None
  if rates.shape != (3,) or not np.all((rates >= 0) & (rates < 1)):
    raise FlagError(
        '--tier_compression_rates needs 3 rates in [0, 1) (small, medium, '
        f'large); got {_TIER_COMPRESSION_RATES.value}.'
    )
  ratio = _int_list('tier_ratio', _TIER_RATIO.value)
  try:
    tier_of_user = tiers.assign_tiers_by_interactions(train_counts, ratio)
  except ValueError as error:
    raise FlagError(f'--tier_ratio: {error}') from None
  return rates[tier_of_user]


def prepare_run(*, log: Callable[[str], None] = print) -> PreparedRun:
  """Checks the flags, loads the data and builds the method."""
  if _METHOD.value is None:
    known = sorted(registry.ALL_METHODS)
    raise FlagError(f'--method is required: one of {", ".join(known)}.')
  if not _ROOT_DIR.value:
    raise FlagError('--root_dir is required (checkpoints and results go there).')
  _remote_workers()  # Bad worker flags stop the run before data loads.
  registry.get_builder(_METHOD.value)  # An unknown method too.
  data_config = _data_config()
  tiered = _METHOD.value in registry.HETERO_METHODS
  summary_fields = {
      'method': _METHOD.value,
      'dataset': data_config.dataset,
      'executor': _executor_summary(),
  }
  prepare = _prepare_tiered if tiered else _prepare_leave_one_out
  data, method, loop_config, run_class, description = prepare(
      data_config, summary_fields
  )
  log(f'{_METHOD.value} on {data_config.dataset}: {data.num_users} users, '
      f'{description}')
  root_dir = _ROOT_DIR.value
  return PreparedRun(
      method_name=_METHOD.value,
      tiered=tiered,
      data=data,
      method=method,
      root_dir=root_dir,
      make_training_run=lambda worker_pid: run_class(
          method, data, loop_config, root_dir,
          log=log, worker_pid=worker_pid, summary_fields=summary_fields,
      ),
      results_table=_hetero_results_table if tiered else _results_table,
  )


def _flag_lines() -> list[str]:
  """This program's flags as flagfile lines."""
  names = sorted(
      holder.name for holder in globals().values()
      if isinstance(holder, flags.FlagHolder)
  )
  return [
      line for line in (flags.FLAGS[name].serialize() for name in names)
      if line
  ]


def write_run_flags(root_dir: str) -> None:
  """Writes <root_dir>/run.flags (atomically), the flags of the run, so that
  `export` can rebuild it."""
  atomic_files.write_atomically(
      os.path.join(root_dir, RUN_FLAGS_FILE), '\n'.join(_flag_lines()) + '\n'
  )


def run() -> dict:
  """Runs the program from the parsed flags; returns the summary."""
  log = lambda line: print(line, flush=True)
  prepared = prepare_run(log=log)
  os.makedirs(prepared.root_dir, exist_ok=True)
  write_run_flags(prepared.root_dir)
  summary = _train_with_worker_restarts(
      prepared.root_dir,
      lambda worker_pid: prepared.make_training_run(worker_pid).train(),
  )
  print(prepared.results_table(summary), flush=True)
  return summary


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.WARNING)
  try:
    run()
  except execution.WorkerDiedError as error:
    restart = (
        'start the worker again and ' if _EXECUTOR.value == 'remote' else ''
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

