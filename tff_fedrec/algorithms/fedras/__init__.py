"""FedRAS (Lu et al., KDD 2025): clustered gradient actions both ways.

Its math: `action_clustering` (a client's actions, Sec. 4.2),
`cluster_and_split` (the server's adaptive downlink, Sec. 4.3),
`compression` (byte accounting and the Top-K / SVD / CoLR baselines),
`information_loss` (Table 3). Its roles: `row_codecs` and `downlink_codecs`
(the codecs each way), `clustered_actions` (the aggregation factory),
`downlink` (the compressed downlink, catch-up and the server's step),
`compressed_exchange` (the exchange of client copies). `bandwidths` (each
user's e_u), `exchange` (the options every local-item method takes) and
`methods` (the registry's builders: FedRAS, its ablations, Topk, SVD,
CoLR, Base).
"""
