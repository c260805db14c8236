"""Flags of local training and of the model (groups `training`,
`local_sgd`, `user_embedding`, `embedding`, `score_layers`, `base_model`).

A flag that is not given leaves the method's own default: its value is
passed to the builder only when given (`group.given`), so a flag's default
never replaces a builder's (`flag_defaults_test`)."""

from absl import flags

from tff_fedrec.algorithms import registry
from tff_fedrec.programs.flag_groups import group

LEARNING_RATE = flags.DEFINE_float(
    'learning_rate', None, 'SGD learning rate of score functions and user '
    'embeddings (default 0.1; fedncf\'s shared MLP trains far better at 3, '
    'its preset\'s value); for the tiered methods (hetefedrec and its '
    'baselines) Adam\'s learning rate of every public parameter (default '
    '0.01; HeteFedRec Sec. V.D\'s 0.001 leaves every model a popularity '
    'ranker, docs/results/hetefedrec.md).',
)
LOCAL_EPOCHS = flags.DEFINE_integer(
    'local_epochs', None,
    'Local epochs E. Not given: the method\'s own (1 for PFedRec, FedMF, '
    'FedNCF, FedRecon and the tiered methods, 2 for FedRAS and its '
    'baselines, 10 for APFR-GKD and FedRAP).',
)
BATCH_SIZE = flags.DEFINE_integer('batch_size', 256, 'Local batch size B.')
ITEM_LEARNING_RATE = flags.DEFINE_float(
    'item_learning_rate', None,
    'SGD learning rate of item embedding rows. Default: learning_rate * '
    'num_items * item_lr_eta, the reference code\'s choice (13,456 on '
    'ML-100K).',
)
ITEM_LR_ETA = flags.DEFINE_float(
    'item_lr_eta', None,
    'eta of the default --item_learning_rate (the method\'s own: 80, '
    'PFedRec\'s reference code; 8 for APFR-GKD).',
)
USER_LEARNING_RATE = flags.DEFINE_float(
    'user_learning_rate', None,
    'Learning rate of the user embedding (methods with one). Default: the '
    'method\'s own (--learning_rate for the local-SGD methods; 0.001 for '
    'the tiered methods\' private user embedding).',
)
DUAL_PERSONALIZATION = flags.DEFINE_bool(
    'dual_personalization', None,
    'Add PFedRec\'s dual personalization to fedmf / fedncf / fedrecon '
    '(Table 3). pfedrec always has it.',
)
UNTRAINED_ITEM_ROWS = flags.DEFINE_enum(
    'untrained_item_rows', 'round_start', ['round_start', 'aggregated'],
    'With dual personalization, which item table scores the items a user '
    'did not fine-tune in its last round: round_start, the table it started '
    'that round from (PFedRec\'s reference code), or aggregated, the '
    'server\'s latest table.',
)
EMBEDDING_DIM = flags.DEFINE_integer('embedding_dim', 32, 'Embedding size.')
HIDDEN_UNITS = flags.DEFINE_list(
    'hidden_units', None,
    'Hidden layers of the score function, e.g. 32,16; given empty '
    '(--hidden_units=), none: one dense layer. Not given: the method\'s own '
    '(PFedRec: none, as in the paper; FedNCF: 32,16,8; FedRAS\'s NCF: '
    '64,32,16; APFR-GKD: 32; the tiered methods\' scorer: 8,8).',
)
# The models of the ranking methods, and of the click-through one (RF²).
RANKING_MODELS = ('mf', 'ncf', 'lightgcn')
CLICK_THROUGH_MODELS = ('dlrm', 'din')
MODEL = flags.DEFINE_enum(
    'model', None, [*RANKING_MODELS, *CLICK_THROUGH_MODELS],
    'FedRAS and its baselines: mf (default) or ncf. Tiered methods: ncf '
    '(default) or lightgcn (one propagation layer on each user\'s local '
    'graph). RF²: dlrm (default) or din.',
)



# Sizes above these would exhaust memory (or a 32-bit dimension) before the
# first round; the papers use 8 to 64 and layers of 8 to 256.
MAX_EMBEDDING_DIM = 4096
MAX_HIDDEN_UNITS = 65536


def _check_training(entry) -> None:
  del entry
  group.require_positive(LOCAL_EPOCHS)
  group.require_finite(LEARNING_RATE, positive=True)


def _training(context: group.BuildContext) -> dict:
  del context
  return {'training': group.given_fields(
      (LOCAL_EPOCHS, 'local_epochs'), (LEARNING_RATE, 'learning_rate'))}


def _check_local_sgd(entry) -> None:
  del entry
  group.require_positive(BATCH_SIZE)
  group.require_finite(ITEM_LEARNING_RATE, ITEM_LR_ETA, positive=True)
  if ITEM_LEARNING_RATE.value is not None and ITEM_LR_ETA.value is not None:
    raise group.FlagError(
        '--item_lr_eta sets the default of --item_learning_rate; give one '
        'of them.')


def _local_sgd(context: group.BuildContext) -> dict:
  del context
  return {'training': group.given_fields(
      (BATCH_SIZE, 'batch_size'),
      (DUAL_PERSONALIZATION, 'dual_personalization'),
      (UNTRAINED_ITEM_ROWS, 'untrained_item_rows'),
      (ITEM_LEARNING_RATE, 'item_learning_rate'),
      (ITEM_LR_ETA, 'item_lr_eta'),
  )}


def _check_user_embedding(entry) -> None:
  del entry
  group.require_finite(USER_LEARNING_RATE, positive=True)


def _user_embedding(context: group.BuildContext) -> dict:
  del context
  return {'training': group.given_fields(
      (USER_LEARNING_RATE, 'user_learning_rate'))}


def _embedding(context: group.BuildContext) -> dict:
  del context
  return group.given_fields((EMBEDDING_DIM, 'embedding_dim'))


def _score_layers(context: group.BuildContext) -> dict:
  del context
  units = hidden_units()
  return {} if units is None else {'hidden_units': units}


def hidden_units() -> tuple[int, ...] | None:
  """--hidden_units as integers; None when not given."""
  if HIDDEN_UNITS.value is None:
    return None
  try:
    units = tuple(int(u) for u in HIDDEN_UNITS.value)
  except ValueError:
    raise group.FlagError(
        '--hidden_units takes comma-separated positive integers, e.g. '
        f'--hidden_units=32,16; got {",".join(HIDDEN_UNITS.value)}.'
    ) from None
  if any(u < 1 for u in units):
    raise group.FlagError(
        f'--hidden_units must be positive; got {",".join(HIDDEN_UNITS.value)}.'
    )
  if any(u > MAX_HIDDEN_UNITS for u in units):
    raise group.FlagError(
        f'--hidden_units={",".join(HIDDEN_UNITS.value)} is too large: at '
        f'most {MAX_HIDDEN_UNITS:,} units a layer.'
    )
  return units


def _model(context: group.BuildContext) -> dict:
  del context
  return {} if MODEL.value is None else {'model': MODEL.value}


def _check_model(entry) -> None:
  if MODEL.value is None:
    return
  click_through = entry.protocol == registry.CLICK_THROUGH
  if (MODEL.value in CLICK_THROUGH_MODELS) != click_through:
    allowed = (CLICK_THROUGH_MODELS if click_through else
               RANKING_MODELS)
    raise group.FlagError(
        f'--model={MODEL.value} does not apply to --method={entry.name}: '
        f'it takes {", ".join(allowed)}.')


GROUPS = (
    group.FlagGroup(
        'training', 'local training', (LEARNING_RATE, LOCAL_EPOCHS),
        _training, _check_training,
    ),
    group.FlagGroup(
        'local_sgd', 'local SGD on the item rows of a user',
        (BATCH_SIZE, ITEM_LEARNING_RATE, ITEM_LR_ETA, DUAL_PERSONALIZATION,
         UNTRAINED_ITEM_ROWS),
        _local_sgd, _check_local_sgd,
    ),
    group.FlagGroup(
        'user_embedding', 'the user embedding\'s learning rate',
        (USER_LEARNING_RATE,), _user_embedding, _check_user_embedding,
    ),
    group.FlagGroup(
        'embedding', 'the embedding width', (EMBEDDING_DIM,), _embedding,
        lambda entry: (
            group.require_positive(EMBEDDING_DIM),
            group.require_at_most(EMBEDDING_DIM, MAX_EMBEDDING_DIM,
                                  'the papers use 8 to 64'),
        ),
    ),
    group.FlagGroup(
        'score_layers', 'the score function\'s layers', (HIDDEN_UNITS,),
        _score_layers, lambda entry: hidden_units(),
    ),
    group.FlagGroup(
        'base_model', 'the base model of FedRAS, the tiered methods and RF²',
        (MODEL,), _model, _check_model,
    ),
)
