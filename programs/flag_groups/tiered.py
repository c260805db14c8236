"""Flags of HeteFedRec's tiered models and training rule (groups
`tier_models`, `hetefedrec`); the users' tiers themselves are every run's
(`tiers`)."""

from absl import flags

from tff_fedrec.programs.flag_groups import group
from tff_fedrec.programs.flag_groups import run
from tff_fedrec.programs.flag_groups import training

TIER_WIDTHS = flags.DEFINE_list(
    'tier_widths', ['8', '16', '32'],
    'Tiered methods: item-embedding sizes N_s,N_m,N_l (Table VII: 2,4,8 / '
    '8,16,32 / 32,64,128).',
)
NEIGHBOR_GRADIENT = flags.DEFINE_bool(
    'lightgcn_neighbor_gradient', True,
    'Tiered methods with --model=lightgcn: whether item vectors also learn '
    'through the user vectors they are propagated into (plain autodiff). '
    '--nolightgcn_neighbor_gradient stops that gradient; see '
    'docs/results/hetefedrec.md, Fed-LightGCN.',
)
USER_OPTIMIZER = flags.DEFINE_enum(
    'user_optimizer', 'sgd', ['sgd', 'adam'],
    'How a client moves its private user embedding: sgd is HeteFedRec\'s '
    'Eq. 3; adam keeps Adam moments in the client state.',
)
# The private user embedding's rate is the shared flag of group
# `user_embedding`.
USER_LR = training.USER_LEARNING_RATE
UPDATE_RULE = flags.DEFINE_enum(
    'update_rule', 'server_adam', ['server_adam', 'local_adam'],
    'server_adam: each client uploads one gradient of its data and the '
    'server takes an Adam step on their sum (default); local_adam: each '
    'client trains --local_epochs epochs of Adam (full batch, or '
    '--local_batch_size) from fresh moments (step --learning_rate, its user '
    'embedding included) and the server adds the sum of the clients\' '
    'changes (HeteFedRec Eq. 4, 8, 9, 15 with the step taken on the '
    'clients).',
)
LOCAL_VALIDATION = flags.DEFINE_float(
    'local_validation_fraction', 0.0,
    'With --update_rule=local_adam: the share of a selected client\'s '
    'examples held out, drawn every round, to guide its local training '
    '(HeteFedRec Sec. V.A: 0.1): the client keeps its local epoch of lowest '
    'held-out loss. 0 trains on everything and keeps the last.',
)
LOCAL_BATCH_SIZE = flags.DEFINE_integer(
    'local_batch_size', 0,
    'With --update_rule=local_adam: 0 makes a local epoch one full-batch '
    'step; B > 0 makes it a pass of Adam steps on batches of B of the '
    'client\'s examples in a fresh random order (the first author\'s public '
    'FedRec code uses 64 or 256).',
)
CHANGE_AGGREGATION = flags.DEFINE_enum(
    'change_aggregation', 'sum', ['sum', 'mean', 'fedavg'],
    'With --update_rule=local_adam: sum: the server adds the clients\' '
    'changes (Eq. 4, 8, 15 as written); mean: each parameter moves by the '
    'mean change of the clients that trained it; fedavg: FedAvg of whole '
    'models, each item row by its summed change over all the round\'s '
    'clients holding it (trained or not).',
)
DUAL_TASK = flags.DEFINE_bool(
    'dual_task', True, 'Unified dual-task learning (Eq. 11).'
)
DECORRELATION_WEIGHT = flags.DEFINE_float(
    'decorrelation_weight', 1.0,
    'alpha of the decorrelation regulariser (Eq. 14); 0 = off.',
)
DISTILLATION_ITEMS = flags.DEFINE_integer(
    'distillation_items', 256,
    'Items in each round\'s distillation subset (Eq. 16); 0 = off.',
)
DISTILLATION_LR = flags.DEFINE_float(
    'distillation_learning_rate', 0.001,
    'Gradient step of the distillation loss (Eq. 17).',
)


def _widths() -> tuple[int, ...]:
  widths = group.int_list('tier_widths', TIER_WIDTHS.value)
  if any(w < 1 for w in widths) or list(widths) != sorted(widths):
    raise group.FlagError(
        '--tier_widths needs 3 positive, non-decreasing widths (small, '
        f'medium, large); got {",".join(TIER_WIDTHS.value)}.'
    )
  return widths


def _check_tier_models(entry) -> None:
  del entry
  _widths()
  if not NEIGHBOR_GRADIENT.value and training.MODEL.value != 'lightgcn':
    raise group.FlagError(
        '--nolightgcn_neighbor_gradient applies to --model=lightgcn only.'
    )


def _tier_models(context: group.BuildContext) -> dict:
  del context
  return {'widths': _widths(), 'neighbor_gradient': NEIGHBOR_GRADIENT.value}


def _check_hetefedrec(entry) -> None:
  local_adam = UPDATE_RULE.value == 'local_adam'
  if local_adam:
    for holder in group.changed_flags((USER_OPTIMIZER, USER_LR)):
      raise group.FlagError(
          f'--{holder.name} does not apply to --update_rule=local_adam: the '
          'user embedding trains with the local Adam (--learning_rate). '
          'Drop the flag.'
      )
  else:
    for holder in group.changed_flags(
        (LOCAL_VALIDATION, CHANGE_AGGREGATION, LOCAL_BATCH_SIZE)):
      raise group.FlagError(
          f'--{holder.name} needs --update_rule=local_adam: under '
          'server_adam a client takes no local steps and the server '
          'aggregates gradients. Add --update_rule=local_adam or drop the '
          'flag.'
      )
    if training.LOCAL_EPOCHS.value not in (None, 1):
      raise group.FlagError(
          f'--local_epochs does not apply to --method={entry.name} '
          'without --update_rule=local_adam: a client takes one gradient of '
          'its whole data per round (HeteFedRec Algorithm 1).'
      )
  if LOCAL_BATCH_SIZE.value < 0:
    raise group.FlagError(
        '--local_batch_size must be >= 0 (0: one full-batch step per local '
        f'epoch); got {LOCAL_BATCH_SIZE.value}.'
    )
  if not 0.0 <= LOCAL_VALIDATION.value < 1.0:
    raise group.FlagError(
        '--local_validation_fraction must be in [0, 1) (the paper holds '
        f'out 0.1); got {LOCAL_VALIDATION.value}.'
    )
  if DISTILLATION_ITEMS.value < 0:
    raise group.FlagError(
        f'--distillation_items must be >= 0; got {DISTILLATION_ITEMS.value}.'
    )
  group.require_finite(DISTILLATION_LR, positive=True)
  group.require_finite(DECORRELATION_WEIGHT)
  if DECORRELATION_WEIGHT.value < 0:
    raise group.FlagError(
        '--decorrelation_weight must be >= 0 (0 turns DDR off); got '
        f'{DECORRELATION_WEIGHT.value}.'
    )


def _hetefedrec(context: group.BuildContext) -> dict:
  return {'training': {
      'dual_task': DUAL_TASK.value,
      'decorrelation_weight': DECORRELATION_WEIGHT.value,
      'distillation_items': DISTILLATION_ITEMS.value,
      'distillation_learning_rate': DISTILLATION_LR.value,
      'user_optimizer': USER_OPTIMIZER.value,
      'update_rule': UPDATE_RULE.value,
      'local_batch_size': LOCAL_BATCH_SIZE.value,
      'validation_fraction': LOCAL_VALIDATION.value,
      'change_aggregation': CHANGE_AGGREGATION.value,
      'seed': run.SEED.value,
  }}


GROUPS = (
    group.FlagGroup(
        'tier_models', 'the tiered models\' sizes',
        (TIER_WIDTHS, NEIGHBOR_GRADIENT), _tier_models, _check_tier_models,
    ),
    group.FlagGroup(
        'hetefedrec', 'HeteFedRec\'s training rule',
        (USER_OPTIMIZER, UPDATE_RULE, LOCAL_VALIDATION,
         LOCAL_BATCH_SIZE, CHANGE_AGGREGATION, DUAL_TASK, DECORRELATION_WEIGHT,
         DISTILLATION_ITEMS, DISTILLATION_LR),
        _hetefedrec, _check_hetefedrec,
    ),
)
