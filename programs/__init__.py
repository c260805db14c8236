"""Driver programs with flags (installed as `tff_fedrec.programs`)."""
