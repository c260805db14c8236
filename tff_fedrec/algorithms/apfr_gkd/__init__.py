"""APFR-GKD (Zhao et al.): adaptive personalization with global knowledge
distillation.

`method` holds the registry's builder (`build_apfr_gkd`, whose `ablation`
gives Table 3's Unary / Dual and the no-buffer / no-KD variants). The
shared pieces it composes: `heterogeneity` (P, Eq. 4-5, and the adapter),
`knowledge_distillation` (Eq. 7-8), `local_training` (the KD phase and the
Dual phase's alternating steps), `templates.finalizers.BufferedGlobalModel`
(Eq. 6) and `templates.distributors.TeacherBroadcast`.
"""
