r"""Trains a federated recommender with TFF and prints a results table.

  python -m tff_fedrec.programs.train --method=pfedrec --dataset=ml-100k \
      --root_dir=runs/pfedrec_ml100k

Paper settings: --flagfile=programs/presets/pfedrec_ml100k.flags (see the
README); a flag given on the command line overrides the preset's, before
or after --flagfile (`training_program.flagfiles_first`). A run killed at
any point resumes from its last checkpoint when started again with the
same --root_dir.
"""

import sys

from absl import app

from tff_fedrec.programs import training_program

if __name__ == '__main__':
  if any(a in ('--help', '-h', '-?', '--helpshort') for a in sys.argv[1:]):
    method = next((a.partition('=')[2] for a in sys.argv[1:]
                   if a.startswith('--method=')), None)
    print(training_program.help_text(method))
    sys.exit(0)
  app.run(training_program.main,
          argv=training_program.flagfiles_first(sys.argv))
