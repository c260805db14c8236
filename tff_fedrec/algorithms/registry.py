"""The one method registry: `--method` name -> builder.

Every builder takes the same keyword arguments (num_items, embedding_dim,
hidden_units, training, seed, model_aggregator, item_aggregator) and returns a
`method.FederatedMethod` (`fedrecon.ReconstructionMethod` for FedRecon). Adding a method is one module and one line here.
"""

from tff_fedrec.algorithms import fedmf
from tff_fedrec.algorithms import fedncf
from tff_fedrec.algorithms import fedrecon
from tff_fedrec.algorithms import pfedrec

METHODS = {
    'pfedrec': pfedrec.build_pfedrec,
    'fedmf': fedmf.build_fedmf,
    'fedncf': fedncf.build_fedncf,
    'fedrecon': fedrecon.build_fedrecon,
}

# Methods that are the dual personalization mechanism itself.
ALWAYS_DUAL_PERSONALIZED = frozenset({'pfedrec'})


def get_builder(name: str):
  """The builder registered as `name`; ValueError naming the known methods."""
  try:
    return METHODS[name]
  except KeyError:
    raise ValueError(
        f'Unknown method {name!r}. Known methods: {", ".join(sorted(METHODS))}.'
    ) from None
