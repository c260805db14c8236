"""Flags of FedRAP (group `fedrap`, Li et al., ICLR 2024).

FedRAP also takes the groups `training` (--learning_rate is its lr_network,
the affine layer's SGD step; --local_epochs, the reference code's 10 when
not given) and `embedding`. Its item
tables' learning rate and its batch size are its own flags: the
`local_sgd` group's --item_learning_rate defaults to PFedRec's
lr * |I| * 80, which means nothing here. A flag left unset keeps the
builder's default (the reference code's, `fedrap.local_training.
FedRAPTrainingConfig`).
"""

from absl import flags

from tff_fedrec.algorithms.fedrap import losses
from tff_fedrec.programs.flag_groups import group

ITEM_LEARNING_RATE = flags.DEFINE_float(
    'fedrap_item_learning_rate', None,
    'FedRAP: lr_args, the SGD step of the rows of D^(i) and C (default 200).',
)
BATCH_SIZE = flags.DEFINE_integer(
    'fedrap_batch_size', None, 'FedRAP: local batch size (default 2048).'
)
LAMBDA = flags.DEFINE_float(
    'fedrap_lambda', None,
    'FedRAP: lambda, weight of -MSE(D^(i), C) (default 0.1).',
)
MU = flags.DEFINE_float(
    'fedrap_mu', None, 'FedRAP: mu, weight of the L1 norm of C (default 0.1).'
)
WEIGHT_SCHEDULE = flags.DEFINE_enum(
    'fedrap_weight_schedule', None, list(losses.WEIGHT_SCHEDULES),
    'FedRAP: fixed lambda and mu (default; what the reference code does) or '
    'tanh, the paper\'s curriculum (weights x tanh(round / 10)).',
)
WEIGHT_DECAY = flags.DEFINE_float(
    'fedrap_weight_decay', None,
    'FedRAP: SGD weight decay of every parameter (l2_regularization, '
    'default 1e-4).',
)
BATCH_LR_DECAY = flags.DEFINE_float(
    'fedrap_batch_lr_decay', None,
    'FedRAP: learning rates x this after every local batch, restarting '
    'each round (ExponentialLR gamma, default 0.95).',
)
ROUND_LR_DECAY = flags.DEFINE_float(
    'fedrap_round_lr_decay', None,
    'FedRAP: learning rates x this after every round (decay_rate, default '
    '0.97).',
)

_FIELDS = (
    (ITEM_LEARNING_RATE, 'item_learning_rate'),
    (BATCH_SIZE, 'batch_size'),
    (LAMBDA, 'lam'),
    (MU, 'mu'),
    (WEIGHT_SCHEDULE, 'weight_schedule'),
    (WEIGHT_DECAY, 'weight_decay'),
    (BATCH_LR_DECAY, 'batch_lr_decay'),
    (ROUND_LR_DECAY, 'round_lr_decay'),
)


def _check(entry) -> None:
  del entry
  group.require_positive(BATCH_SIZE)
  group.require_finite(ITEM_LEARNING_RATE, BATCH_LR_DECAY, ROUND_LR_DECAY,
                       positive=True)
  group.require_finite(LAMBDA, MU, WEIGHT_DECAY)


def _arguments(context: group.BuildContext) -> dict:
  del context
  return {'training': group.given_fields(*_FIELDS)}


GROUPS = (
    group.FlagGroup(
        'fedrap', 'FedRAP\'s local training',
        tuple(holder for holder, _ in _FIELDS), _arguments, _check,
    ),
)
