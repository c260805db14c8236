r"""Exports a trained run's models to TFLite for on-device inference.

  python -m tff_fedrec.programs.export --root_dir=runs/pfedrec_ml100k \
      --users=1,2,3

rebuilds the run from <root_dir>/run.flags (written by `train`), restores its
latest checkpoint (finished or not) and writes to --output_dir (default
<root_dir>/tflite):

  tier_<tier>/<quantization>.tflite   each tier's global model (`--tiers`)
  user_<name>/<quantization>.tflite   each --users model; <name> is the id
                                      percent-encoded (`export_layout`)
  item_ids.json                       the data set's item id of each model row
  manifest.json                       tier, user (the id as in the data),
                                      path, embedding size, quantization,
                                      size and SHA-256 per file: find a
                                      user's file here, not by its name

for each quantization of `--quantizations` (float32, float16, dynamic_range,
full_integer; full-integer is calibrated on the user's own training data,
positives and sampled negatives).
Every file is loaded in the TFLite interpreter and checked against the TF
model: the largest score difference, and the ranking metrics of the run's
protocol computed by running the interpreter next to the same metrics of the
TF model (HR@10 / NDCG@10 on the leave-one-out test split; Recall@20 /
NDCG@20 by full ranking for the tiered methods). `export_report.json` holds
them; a table is printed.

The export is a transaction (`export_directory`): it is written into a
hidden folder beside --output_dir, checked against its manifest and renamed
into place, so when it fails (a bad input, Ctrl-C, kill -9, a full disk) an
earlier export there stays whole. --output_dir is replaced as a whole, so it
must be new, empty or an earlier export. Files get the user's umask (0644,
folders 0755 under umask 022).
"""

from absl import app

from tff_fedrec.programs import export_program

if __name__ == '__main__':
  app.run(export_program.main)
