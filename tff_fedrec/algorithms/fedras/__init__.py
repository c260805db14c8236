"""FedRAS (Lu et al., KDD 2025): clustered gradient actions both ways.

`bandwidths` (each user's e_u), `exchange` (FedRAS's exchange and the codec
baselines', as options every local-item method takes) and `methods` (the
registry's builders: FedRAS, its ablations, Topk, SVD, CoLR, Base).
"""
