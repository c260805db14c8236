"""On-device export of trained models (installed as `tff_fedrec.export`)."""
