"""APFR-GKD (Zhao et al.): adaptive personalization with global knowledge
distillation.

`heterogeneity` (P, Eq. 4-5, and the adapter), `kd_loss` (Eq. 7-8),
`client_round` (what APFR-GKD changes in the local-item client round: its
start, its distillation term, the model each user keeps), `global_buffer`
(the buffer of Eq. 6 and the teacher's broadcast) and `method` (the
registry's builder `build_apfr_gkd`, whose `ablation` gives Table 3's Unary
/ Dual and the no-buffer / no-KD variants), composed with the shared
local-item layer (`algorithms.local_items`).
"""
