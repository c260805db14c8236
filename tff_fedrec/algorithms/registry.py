"""The one method registry: `--method` name -> builder.

`METHODS` (leave-one-out protocol of PFedRec): every builder takes the same
keyword arguments (num_items, embedding_dim, hidden_units, training, seed,
model_aggregator, item_aggregator) and returns a `method.FederatedMethod`
(`fedrecon.ReconstructionMethod` for FedRecon).

`HETERO_METHODS` (HeteFedRec's tiers, random split, full ranking): every
builder takes (spec, config, seed) and returns a `hetefedrec.HeteroMethod`.

`COMPRESSED_METHODS` (FedRAS and its baselines, leave-one-out): the keyword
arguments of `METHODS` plus model ('mf' | 'ncf'), compression_rate and, for
some, catch_up_rounds, resync_when_cheaper, alpha and
compression_rate_range (`fedras`).

Adding a method is one module and one line here.
"""

import functools

from tff_fedrec.algorithms import fedmf
from tff_fedrec.algorithms import fedncf
from tff_fedrec.algorithms import fedras
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

COMPRESSED_METHODS = {
    'fedras': fedras.build_fedras,
    'fedras_e': functools.partial(fedras.build_fedras, ablation='E'),
    'fedras_f': functools.partial(fedras.build_fedras, ablation='F'),
    'fedras_t': functools.partial(fedras.build_fedras, ablation='T'),
    'topk': fedras.build_topk,
    'svd': fedras.build_svd,
    'colr': fedras.build_colr,
    'base_small_dim': fedras.build_base_small_dim,
}

ALL_METHODS = {**METHODS, **HETERO_METHODS, **COMPRESSED_METHODS}

# Methods that are the dual personalization mechanism itself.
ALWAYS_DUAL_PERSONALIZED = frozenset({'pfedrec'})


def get_builder(name: str):
  """The builder registered as `name`; ValueError naming the known methods."""
  try:
    return ALL_METHODS[name]
  except KeyError:
    known = sorted(ALL_METHODS)
    raise ValueError(
        f'Unknown method {name!r}. Known methods: {", ".join(known)}.'
    ) from None
