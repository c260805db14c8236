"""FedRecon (Singhal et al., NeurIPS 2021) as PFedRec's baseline: TFF's own
`build_fed_recon` (`method`) and the reconstruction of every user's
embedding for evaluation (`reconstruction`)."""
