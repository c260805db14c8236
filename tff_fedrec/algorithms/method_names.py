"""The `--method` names, importable without TensorFlow.

`registry` maps each name to its builder, and `registry_test` checks that
the two agree. Programs that only check a name (`benchmark`'s `--methods`)
import this module instead of the registry, which imports TensorFlow and
TFF (about 10 s here).
"""

# PFedRec's leave-one-out protocol (`registry.METHODS`).
LEAVE_ONE_OUT = ('pfedrec', 'fedmf', 'fedncf', 'fedrecon')

# HeteFedRec's tiers (`registry.HETERO_METHODS`).
TIERED = (
    'hetefedrec', 'direct_aggregate', 'clustered', 'all_small', 'all_large',
    'all_large_exclusive', 'standalone',
)

# FedRAS and its baselines (`registry.COMPRESSED_METHODS`).
COMPRESSED = (
    'fedras', 'fedras_e', 'fedras_f', 'fedras_t', 'topk', 'svd', 'colr',
    'base_small_dim',
)

ALL = LEAVE_ONE_OUT + TIERED + COMPRESSED
