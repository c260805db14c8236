"""Flags of the run itself (group `run`, every run): the method, rounds,
clients, seed and where the results go."""

from absl import flags

from tff_fedrec.algorithms import registry
from tff_fedrec.programs import training_loop
from tff_fedrec.programs.flag_groups import group
from tff_fedrec.templates import cohorts

METHOD = flags.DEFINE_string(
    'method', None,
    'Federated method to train: a name of the method registry '
    f'({", ".join(registry.METHODS)}, or one a program registered).'
)
ROUNDS = flags.DEFINE_integer('rounds', 100, 'Communication rounds.')
EPOCHS = flags.DEFINE_integer(
    'epochs', None,
    'Train this many epochs of the protocol\'s clients instead of --rounds: '
    'rounds = epochs x rounds per epoch (RF²\'s click-through: every '
    'client that trains does once an epoch, fewer rounds when a tier is '
    'excluded or clients are overselected).',
)
CLIENTS_PER_ROUND = flags.DEFINE_integer(
    'clients_per_round', None,
    'Clients per round (default: all users for the leave-one-out methods, '
    'as in PFedRec; min(256, users) for the random-split ones, HeteFedRec '
    'Sec. V.D).',
)
CLIENT_FRACTION = flags.DEFINE_float(
    'client_fraction', None, 'Fraction of users per round (alternative to '
    '--clients_per_round).',
)
USERS_PER_TFF_CLIENT = flags.DEFINE_integer(
    'users_per_tff_client', 32,
    'Users one TFF client simulates at once (tff_fedrec.templates.'
    'user_groups). Results do not depend on it; larger groups share TFF\'s '
    'per-client cost. 1 = one TFF client per user. fedrecon always uses 1.',
)
COHORT_SIZE = flags.DEFINE_integer(
    'cohort_size', cohorts.DEFAULT_COHORT_SIZE,
    'Train at most this many users at once (rounded down to whole TFF '
    'clients of --users_per_tff_client users, at least one): a round runs '
    'as cohorts whose '
    'uploads are merged as each finishes (tff_fedrec.templates.cohorts), so '
    'memory follows this, not the users per round. Results agree with one '
    'cohort to float rounding. A size of at least the round\'s users trains '
    'them all in one computation. Ignored on remote workers, whose context '
    'splits the clients itself.',
)
COHORT_STATE_MB = flags.DEFINE_float(
    'cohort_state_mb', cohorts.DEFAULT_COHORT_STATE_BYTES / 2**20,
    'Fewer users than --cohort_size train at once when their client state '
    '(the store\'s mean per user, read each round) would pass this many MiB: '
    'the largest power of two of users that fits, at least 32. 0: no bound.',
)
NEGATIVES = flags.DEFINE_integer(
    'num_negatives', 4, 'Training negatives per positive.'
)
SEED = flags.DEFINE_integer('seed', 0, 'Seed of everything random.')
ROOT_DIR = flags.DEFINE_string(
    'root_dir', None, 'Output directory (checkpoints, metrics, summary.json).'
)
EVAL_EVERY = flags.DEFINE_integer(
    'eval_every', None,
    'Evaluate every N rounds (default 1; for the random-split methods one '
    'epoch of the client queue).',
)
CHECKPOINT_EVERY = flags.DEFINE_integer(
    'checkpoint_every', 1, 'Checkpoint every N rounds.'
)
CLIENT_STORE = flags.DEFINE_enum(
    'client_store', 'memory', list(training_loop.CLIENT_STORES),
    'Where the users\' client state lives between rounds: memory (fastest '
    'for small data; every checkpoint writes all of it), or disk: an SQLite '
    'database in <root_dir>/checkpoints whose commit at each checkpoint '
    'writes only the users that changed, so memory and checkpoints follow '
    'the clients per round, not the users (a million users: '
    'docs/results/scale.md).',
)
MAX_WORKER_RESTARTS = flags.DEFINE_integer(
    'max_worker_restarts', 3,
    'If the TFF worker dies, restart it and resume from the last checkpoint '
    'this many times before giving up.',
)


def rounds(rounds_per_epoch: int) -> int:
  """The rounds to train: --epochs x `rounds_per_epoch`, or --rounds."""
  if EPOCHS.value is None:
    return ROUNDS.value
  return EPOCHS.value * rounds_per_epoch


def clients_per_round(num_users: int):
  """--clients_per_round or --client_fraction of `num_users` users, or None
  for the protocol's default."""
  if CLIENTS_PER_ROUND.value is not None and CLIENT_FRACTION.value is not None:
    raise group.FlagError(
        'Give --clients_per_round or --client_fraction, not both.'
    )
  if CLIENT_FRACTION.value is not None:
    if not 0 < CLIENT_FRACTION.value <= 1:
      raise group.FlagError('--client_fraction must be in (0, 1].')
    return max(1, int(num_users * CLIENT_FRACTION.value))
  if CLIENTS_PER_ROUND.value is None:
    return None
  if not 1 <= CLIENTS_PER_ROUND.value <= num_users:
    raise group.FlagError(
        f'--clients_per_round must be in [1, {num_users}] (the number of '
        f'users); got {CLIENTS_PER_ROUND.value}.'
    )
  return CLIENTS_PER_ROUND.value


# Training negatives per positive: a round's examples are this many times
# its positives.
MAX_NEGATIVES = 1000
# numpy's and TensorFlow's seeds take 32 bits here (`np.random.default_rng`
# would take more, TensorFlow's int64 seeds would not).
MAX_SEED = 2**32 - 1


def _check(entry) -> None:
  del entry
  if not 0 <= SEED.value <= MAX_SEED:
    raise group.FlagError(
        f'--seed={SEED.value} is out of range: give an integer from 0 to '
        f'{MAX_SEED}.'
    )
  # run.flags records --rounds' default too, which an export reads back as
  # given: only another value clashes with --epochs.
  if (EPOCHS.value is not None
      and ROUNDS.value != flags.FLAGS['rounds'].default):
    raise group.FlagError('Give --rounds or --epochs, not both.')
  group.require_positive(ROUNDS, EPOCHS, USERS_PER_TFF_CLIENT, CHECKPOINT_EVERY,
                         EVAL_EVERY, NEGATIVES, CLIENTS_PER_ROUND,
                         COHORT_SIZE)
  group.require_at_most(NEGATIVES, MAX_NEGATIVES,
                        'each round holds positives x negatives examples; '
                        'the papers use 4')
  if MAX_WORKER_RESTARTS.value < 0:
    raise group.FlagError(
        f'--max_worker_restarts must be >= 0; got {MAX_WORKER_RESTARTS.value}.'
    )
  if not 0 <= COHORT_STATE_MB.value < 2**40:  # Also refuses nan.
    raise group.FlagError(
        f'--cohort_state_mb must be a number of MiB from 0 (no bound) up; '
        f'got {COHORT_STATE_MB.value}.')
  if CLIENTS_PER_ROUND.value is not None and CLIENT_FRACTION.value is not None:
    raise group.FlagError(
        'Give --clients_per_round or --client_fraction, not both.'
    )
  if CLIENT_FRACTION.value is not None and not 0 < CLIENT_FRACTION.value <= 1:
    raise group.FlagError(
        f'--client_fraction must be in (0, 1]; got {CLIENT_FRACTION.value}.')


GROUPS = (
    group.FlagGroup(
        'run', 'the run',
        (METHOD, ROUNDS, EPOCHS, CLIENTS_PER_ROUND, CLIENT_FRACTION,
         USERS_PER_TFF_CLIENT, COHORT_SIZE, COHORT_STATE_MB, NEGATIVES, SEED,
         ROOT_DIR, EVAL_EVERY, CHECKPOINT_EVERY, CLIENT_STORE,
         MAX_WORKER_RESTARTS),
        check=_check,
    ),
)
