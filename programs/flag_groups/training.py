"""Flags of local training and of the model (groups `training`,
`local_sgd`, `embedding`, `score_layers`, `base_model`)."""

from absl import flags

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
    'local_epochs', 1,
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
    'item_lr_eta', 80.0, 'eta of the default --item_learning_rate.'
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
    'hidden_units', [],
    'Hidden layers of the score function (PFedRec: empty = one dense layer, '
    'as in the paper), of the NCF MLP (empty = 32,16,8; FedRAS: 64,32,16) '
    'or of the tiered methods\' scorer (empty = 8,8).',
)
MODEL = flags.DEFINE_enum(
    'model', None, ['mf', 'ncf', 'lightgcn'],
    'FedRAS and its baselines: mf (default) or ncf. Tiered methods: ncf '
    '(default) or lightgcn (one propagation layer on each user\'s local '
    'graph).',
)


def _check_training(entry) -> None:
  del entry
  group.require_positive(LOCAL_EPOCHS)
  group.require_finite(LEARNING_RATE, positive=True)


def _training(context: group.BuildContext) -> dict:
  fields = {}
  if flags.FLAGS[LOCAL_EPOCHS.name].present:
    fields['local_epochs'] = LOCAL_EPOCHS.value
  if LEARNING_RATE.value is not None:
    fields['learning_rate'] = LEARNING_RATE.value
  del context
  return {'training': fields}


def _check_local_sgd(entry) -> None:
  del entry
  group.require_positive(BATCH_SIZE)
  group.require_finite(ITEM_LEARNING_RATE, ITEM_LR_ETA, positive=True)


def _local_sgd(context: group.BuildContext) -> dict:
  fields = {'batch_size': BATCH_SIZE.value}
  if DUAL_PERSONALIZATION.value is not None:
    fields['dual_personalization'] = DUAL_PERSONALIZATION.value
  fields['untrained_item_rows'] = UNTRAINED_ITEM_ROWS.value
  item_learning_rate = ITEM_LEARNING_RATE.value
  if item_learning_rate is None:
    learning_rate = LEARNING_RATE.value
    if learning_rate is None:
      learning_rate = context.entry.default('training').learning_rate
    item_learning_rate = (
        learning_rate * context.data.num_items * ITEM_LR_ETA.value
    )
  fields['item_learning_rate'] = item_learning_rate
  return {'training': fields}


def _embedding(context: group.BuildContext) -> dict:
  del context
  return {'embedding_dim': EMBEDDING_DIM.value}


def hidden_units() -> tuple[int, ...]:
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
  return units


def _model(context: group.BuildContext) -> dict:
  del context
  return {} if MODEL.value is None else {'model': MODEL.value}


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
        'embedding', 'the embedding width', (EMBEDDING_DIM,), _embedding,
        lambda entry: group.require_positive(EMBEDDING_DIM),
    ),
    group.FlagGroup(
        'score_layers', 'the score function\'s layers', (HIDDEN_UNITS,),
        lambda context: {'hidden_units': hidden_units()},
        lambda entry: hidden_units(),
    ),
    group.FlagGroup(
        'base_model', 'the base model of FedRAS and the tiered methods',
        (MODEL,), _model,
    ),
)
