"""HeteFedRec (Yuan et al., ICDE 2024): tiers of model size.

`process` (the TFF process: unified dual-task learning, padding-aware
aggregation, RESKD), `standalone` (the Standalone baseline's process) and
`tiered_method` (the registry's builders and their driver).
"""
