"""Flags of APFR-GKD (group `apfr_gkd`): the adapter, the buffer and the
distillation (Zhao et al., Eq. 4-8, Algorithm 1)."""

from absl import flags

from tff_fedrec.algorithms.apfr_gkd import client_round
from tff_fedrec.algorithms.apfr_gkd import global_buffer
from tff_fedrec.algorithms.apfr_gkd import heterogeneity
from tff_fedrec.algorithms.apfr_gkd import kd_loss
from tff_fedrec.algorithms.apfr_gkd import method as apfr_gkd
from tff_fedrec.programs.flag_groups import group

PERSONALIZATION = flags.DEFINE_enum(
    'personalization', 'auto', list(apfr_gkd.PERSONALIZATIONS),
    'APFR-GKD: auto lets the adapter choose (Dual iff the heterogeneity P '
    '>= --heterogeneity_threshold, Algorithm 1); unary: distillation only; '
    'dual: a PFedRec-style phase, then distillation (two exchanges a '
    'round).',
)
HETEROGENEITY_THRESHOLD = flags.DEFINE_float(
    'heterogeneity_threshold', heterogeneity.DEFAULT_THRESHOLD,
    'APFR-GKD: epsilon of the adapter (P is printed at the start of a run '
    'and kept in summary.json).',
)
BUFFER_SIZE = flags.DEFINE_integer(
    'buffer_size', 5,
    'APFR-GKD: M, the aggregated global models averaged into the teacher '
    '(Eq. 6; FedGKD\'s 5).',
)
CLIENT_START = flags.DEFINE_enum(
    'client_start', None, list(client_round.CLIENT_STARTS),
    'APFR-GKD: where a client\'s local training starts each round (the two '
    'readings of Algorithm 1). download (default): the global model it '
    'downloads, keeping its user embedding; own_model (the presets): its '
    'own model as its last training left it (every item row it ever '
    'trained, its own score MLP), the global model reaching it only as the '
    'distillation teacher. own_model reaches Table 2 under the papers\' '
    'negative pool; under the leak-free pool download reaches its level in '
    '10 rounds at any participation, own_model only with every client '
    'training about 70 times (docs/results/apfr_gkd.md).',
)
STUDENT_START = flags.DEFINE_enum(
    'student_start', None, list(global_buffer.BUFFER_STUDENT_STARTS),
    'APFR-GKD with --client_start=download: clients train from the buffer\'s '
    'average (buffer_average, the default: Algorithm 1, the teacher itself) '
    'or from the latest aggregate, the average being the teacher only '
    '(FedGKD; the teacher is then a second download).',
)
DISTILLATION_WEIGHT = flags.DEFINE_float(
    'distillation_weight', 0.1, 'APFR-GKD: mu of Eq. 8 (FedGKD\'s 0.1).'
)
TEMPERATURE = flags.DEFINE_float(
    'temperature', 1.0, 'APFR-GKD: tau of Eq. 7 (FedGKD\'s 1).'
)
DISTILLATION = flags.DEFINE_enum(
    'distillation', 'binary', list(kd_loss.DISTILLATION_KINDS),
    'APFR-GKD: binary, the KL of each example\'s [sigmoid, 1 - sigmoid] '
    'at temperature tau; listwise, the KL of the softmax over a user\'s '
    'examples in a batch.',
)


def _check(entry) -> None:
  client_start = CLIENT_START.value or entry.default('client_start')
  if client_start == 'own_model' and STUDENT_START.value is not None:
    raise group.FlagError(
        '--student_start sets what a client trains from after a download; '
        'with --client_start=own_model it trains from its own model. Drop '
        '--student_start.')
  group.require_positive(BUFFER_SIZE)
  group.require_finite(HETEROGENEITY_THRESHOLD)
  group.require_finite(TEMPERATURE, positive=True)
  group.require_finite(DISTILLATION_WEIGHT)
  if DISTILLATION_WEIGHT.value < 0:
    raise group.FlagError(
        f'--distillation_weight must be >= 0; got {DISTILLATION_WEIGHT.value}.'
    )


def _arguments(context: group.BuildContext) -> dict:
  del context
  return {
      'personalization': PERSONALIZATION.value,
      'heterogeneity_threshold': HETEROGENEITY_THRESHOLD.value,
      'buffer_size': BUFFER_SIZE.value,
      **group.given_fields((STUDENT_START, 'student_start'),
                           (CLIENT_START, 'client_start')),
      'distillation': client_round.DistillationOptions(
          weight=DISTILLATION_WEIGHT.value,
          temperature=TEMPERATURE.value, kind=DISTILLATION.value,
      ),
  }


GROUPS = (
    group.FlagGroup(
        'apfr_gkd', 'APFR-GKD\'s adapter, buffer and distillation',
        (PERSONALIZATION, CLIENT_START, HETEROGENEITY_THRESHOLD, BUFFER_SIZE,
         STUDENT_START, DISTILLATION_WEIGHT, TEMPERATURE, DISTILLATION),
        _arguments, _check,
    ),
)
