"""HeteFedRec (Yuan et al., ICDE 2024): tiers of model size.

Its math: `models` (the tiers' Fed-NCF / Fed-LightGCN models), `dual_task`
(unified dual-task learning with decorrelation, Eq. 11-14, and the
clients' local Adam), `decorrelation` (Eq. 13) and `reskd` (relation-based
ensemble self-distillation, Eq. 16-17, and its finalizer). Its process:
`process` (padding-aware aggregation, Eq. 7-8) and `standalone` (the
Standalone baseline's); `tiered_method` holds the registry's builders and
their driver.
"""
