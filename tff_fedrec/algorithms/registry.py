"""The one method registry: `--method` name -> builder.

`METHODS` (leave-one-out protocol of PFedRec): every builder takes the same
keyword arguments (num_items, embedding_dim, hidden_units, training, seed,
model_aggregator, item_aggregator) and returns a `method.FederatedMethod`
(`fedrecon.ReconstructionMethod` for FedRecon).

`HETERO_METHODS` (HeteFedRec's tiers, random split, full ranking): every
builder takes (spec, config, seed) and returns a `hetefedrec.HeteroMethod`.

Adding a method is one module and one line here.
"""

from tff_fedrec.algorithms import fedmf
from tff_fedrec.algorithms import fedncf
from tff_fedrec.algorithms import fedrecon
from tff_fedrec.algorithms import hetefedrec
from tff_fedrec.algorithms import pfedrec
from tff_fedrec.algorithms import standalone

METHODS = {
    'pfedrec': pfedrec.build_pfedrec,
    'fedmf': fedmf.build_fedmf,
    'fedncf': fedncf.build_fedncf,
    'fedrecon': fedrecon.build_fedrecon,
}

HETERO_METHODS = {
    'hetefedrec': hetefedrec.build_hetefedrec,
    'direct_aggregate': hetefedrec.build_direct_aggregate,
    'clustered': hetefedrec.build_clustered,
    'all_small': hetefedrec.build_all_small,
    'all_large': hetefedrec.build_all_large,
    'all_large_exclusive': hetefedrec.build_all_large_exclusive,
    'standalone': standalone.build_standalone,
}

# Methods that are the dual personalization mechanism itself.
ALWAYS_DUAL_PERSONALIZED = frozenset({'pfedrec'})


def get_builder(name: str):
  """The builder registered as `name`; ValueError naming the known methods."""
  try:
    return {**METHODS, **HETERO_METHODS}[name]
  except KeyError:
    known = sorted({**METHODS, **HETERO_METHODS})
    raise ValueError(
        f'Unknown method {name!r}. Known methods: {", ".join(known)}.'
    ) from None
