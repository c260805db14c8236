"""Data sets and their preprocessing (installed as `tff_fedrec.tasks`)."""
