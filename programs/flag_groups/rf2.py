"""Flags of RF² (group `rf2`, Maeng et al., RecSys '22): the server's
learning rate. Its model is --model=dlrm|din (group `base_model`), its
tiers --device_tiers (group `tiers`), its optimisation and paired baseline
--tier_optimization / --paired_baseline (group `tier_optimization`, every
method's), its protocol click_through.

Example:
  --method=rf2 --model=dlrm --device_tiers=dirichlet:0.05 \\
      --tier_optimization=quants:4,8,32 --paired_baseline=runs/none_seed0
"""

from absl import flags

from tff_fedrec.programs.flag_groups import group

SERVER_LEARNING_RATE = flags.DEFINE_float(
    'server_learning_rate', None,
    'RF²: the server\'s Adagrad learning rate (default 0.1, the paper\'s on '
    'MovieLens).',
)


def _check(entry) -> None:
  del entry
  group.require_finite(SERVER_LEARNING_RATE, positive=True)


def _arguments(context: group.BuildContext) -> dict:
  del context
  return group.given_fields((SERVER_LEARNING_RATE, 'server_learning_rate'))


GROUPS = (
    group.FlagGroup('rf2', 'RF²\'s server step', (SERVER_LEARNING_RATE,),
                    _arguments, _check),
)
