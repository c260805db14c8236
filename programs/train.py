r"""Trains a federated recommender with TFF and prints a results table.

  python -m tff_fedrec.programs.train --method=pfedrec --dataset=ml-100k \
      --root_dir=runs/pfedrec_ml100k

Paper settings: --flagfile=programs/presets/pfedrec_ml100k.flags (see the
README). A run killed at any point resumes from its last checkpoint when
started again with the same --root_dir.
"""

from absl import app

from tff_fedrec.programs import training_program

if __name__ == '__main__':
  app.run(training_program.main)
