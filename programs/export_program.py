"""The export program (`python -m tff_fedrec.programs.export`): its flags,
`export()` and `main`. The binary `export.py` documents the usage and
calls `main`; tests call `main` in-process.
"""

import json
import os
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

from tff_fedrec import atomic_files
from tff_fedrec.algorithms.rf2 import models as click_models
from tff_fedrec.export import manifest
from tff_fedrec.export import on_device_click_model
from tff_fedrec.export import on_device_model
from tff_fedrec.export import tflite_conversion
from tff_fedrec.programs import execution
from tff_fedrec.programs import export_directory
from tff_fedrec.programs import export_layout
from tff_fedrec.programs import exported_models
from tff_fedrec.programs import interrupts
from tff_fedrec.programs import training_program
from tff_fedrec.tasks import errors

_USERS = flags.DEFINE_list(
    'users', [], 'Original ids of the users whose own models to export, or '
    '"all".'
)
_TIERS = flags.DEFINE_list(
    'tiers', None, 'Tiers whose global model to export (default: every tier '
    'the run trains; "single" for one-size methods).'
)
_QUANTIZATIONS = flags.DEFINE_list(
    'quantizations', list(tflite_conversion.QUANTIZATIONS),
    f'Any of {", ".join(tflite_conversion.QUANTIZATIONS)}.'
)
_OUTPUT_DIR = flags.DEFINE_string(
    'output_dir', None, 'Where the models go (default <root_dir>/tflite).'
)
_TOP_K = flags.DEFINE_integer(
    'top_k', 10, 'K of the top_k signature.', lower_bound=1
)
_EVAL_USERS = flags.DEFINE_integer(
    'max_eval_users', None,
    'Evaluate a global model on at most this many of its users (default: '
    'all).', lower_bound=1,
)


# Training flags `export` takes on its command line, over the run's own: where
# the run is, and where its data is now (files move).
_DATA_LOCATION_FLAGS = ('root_dir', 'data_path', 'cache_dir')


def _load_run_flags(root_dir: str) -> None:
  """Sets the training flags to the run's (from run.flags), but for the
  data location given on the command line; refuses any other training flag
  given there, which the run's own would silently replace."""
  given = {
      name: flags.FLAGS[name].value for name in training_program.known_flags()
      if flags.FLAGS[name].present
  }
  for name in sorted(set(given) - set(_DATA_LOCATION_FLAGS)):
    raise exported_models.ExportError(
        f'--{name} is a training flag: export rebuilds the run from the flags '
        f'it was trained with ({root_dir}/{training_program.RUN_FLAGS_FILE}). '
        'Drop it; only --data_path and --cache_dir may be given, when the '
        'data moved.'
    )
  path = os.path.join(root_dir, training_program.RUN_FLAGS_FILE)
  if not os.path.isfile(path):
    raise exported_models.ExportError(
        f'{root_dir} is not a training run directory: it has no '
        f'{training_program.RUN_FLAGS_FILE}. Give --root_dir of a run of '
        '`python -m tff_fedrec.programs.train`.'
    )
  args = flags.FLAGS.read_flags_from_files([f'--flagfile={path}'])
  flags.FLAGS([sys.argv[0], *args])
  # The run or its data may have moved, and export always runs on a local
  # worker.
  for name, value in given.items():
    setattr(flags.FLAGS, name, value)
  flags.FLAGS.root_dir = root_dir
  flags.FLAGS.executor = 'local'
  flags.FLAGS.workers = []


class _Scorer:
  """Logits of item ids for an optional user vector: the TF module, or the
  TFLite interpreter running the exported file."""

  def __init__(self, module=None, model_bytes=None):
    if model_bytes is None:
      self._score = lambda **inputs: module.score(**inputs)['scores'].numpy()
    else:
      interpreter = tf.lite.Interpreter(model_content=model_bytes)
      runner = interpreter.get_signature_runner(
          on_device_model.SCORE_SIGNATURE
      )
      self._score = lambda **inputs: runner(**inputs)['scores']

  def __call__(self, items, user_vector=None):
    inputs = {'item_ids': np.asarray(items, np.int32)}
    if user_vector is not None:
      inputs['user_embedding'] = np.asarray(user_vector, np.float32)
    return np.asarray(self._score(**inputs), np.float32)


def _eval_cases(model, limit):
  users, vectors = model.eval_users, model.eval_user_vectors
  if limit is not None and users.size > limit:
    chosen = np.random.default_rng(0).choice(users.size, limit, replace=False)
    chosen.sort()
    users = users[chosen]
    vectors = None if vectors is None else vectors[chosen]
  if vectors is None:
    vectors = [None] * users.size
  return users, vectors


def _ranking_metrics(prepared, model, scorer, limit) -> dict:
  """The run's test metrics of `model` as `scorer` scores it."""
  users, vectors = _eval_cases(model, limit)
  # int8 scores tie often, and both rankings resolve ties in a fixed way
  # (sampled: against the test item; full: lower item index first, roughly
  # popularity order here). Ties are broken at random instead: a seeded
  # jitter per item, far below float32's spacing at any real score gap
  # (the scores are float64 for this).
  jitter = np.random.default_rng(0).random(prepared.data.num_items) * 1e-12
  return prepared.protocol.test_metrics(
      users,
      lambda position, items: (
          scorer(items, vectors[position]).astype(np.float64) + jitter[items]
      ),
  )


def _logit_differences(model, reference, scorer) -> dict:
  """Over all items for (up to 8 of) the model's users: the largest
  |TFLite - TF| logit, and the largest |TF logit|, its scale (float32
  rounds logits of size L to about L * 6e-8)."""
  _, vectors = _eval_cases(model, 8)
  items = np.arange(model.params['item_embedding'].shape[0])
  expected = [reference(items, v) for v in vectors]
  return {
      'max_abs_logit_difference': max(
          float(np.max(np.abs(scorer(items, v) - want)))
          for v, want in zip(vectors, expected)
      ),
      'max_abs_logit': max(float(np.max(np.abs(want))) for want in expected),
  }


def _click_scorer(module=None, model_bytes=None):
  """Logits of `method.FeatureRows`: the TF module, or the TFLite
  interpreter running the exported file."""
  if model_bytes is None:
    run = lambda **inputs: module.predict(**inputs)['logits'].numpy()
  else:
    runner = tf.lite.Interpreter(model_content=model_bytes).get_signature_runner(
        on_device_click_model.PREDICT_SIGNATURE)
    run = lambda **inputs: runner(**inputs)['logits']
  # An empty batch would crash TFLite's interpreter (a segmentation fault).
  return lambda rows: np.zeros([0], np.float32) if not rows.users.size else (
      np.asarray(run(**{
      name: np.asarray(value, np.int32) for name, value in
      on_device_click_model.OnDeviceClickModel.inputs(rows.features).items()
  }), np.float32))


def _export_click_model(prepared, model, output_dir, quantizations, report):
  """A device tier's click-through model (RF²): its `predict` file per
  quantization, with the AUC and log-loss of the tier's test events by TF
  and by the file."""
  shapes = prepared.protocol.run_data().feature_shapes
  module = on_device_click_model.OnDeviceClickModel(
      click_models.spec_of(model.architecture, model.params), model.params,
      genres_width=shapes['genres_width'],
      history_length=shapes['history_length'])
  users, _ = _eval_cases(model, _EVAL_USERS.value)
  protocol = prepared.protocol
  metrics_of = lambda scorer: protocol.test_metrics(
      users, lambda position, rows: scorer(rows))
  reference = _click_scorer(module=module)
  tf_metrics = metrics_of(reference)
  # Calibration and comparison rows: the first users' test events.
  sample = protocol.feature_rows(protocol.test_rows(users[:8]))
  name = export_layout.model_folder(tier=model.tier, user_id=None)
  entries = []
  for quantization in quantizations:
    start = time.perf_counter()
    model_bytes = tflite_conversion.convert_to_tflite(
        module, quantization, representative_samples=lambda: (
            (on_device_click_model.PREDICT_SIGNATURE,
             {k: np.asarray(v[s:s + 32], np.int32) for k, v in
              on_device_click_model.OnDeviceClickModel.inputs(
                  sample.features).items()})
            # Whole batches: TFLite's calibrator keeps a stale shape of
            # DIN's attention when the batch size changes between samples.
            for s in range(0, max(sample.users.size - 31, 1), 32)))
    seconds = time.perf_counter() - start
    entries.append(manifest.write_model_file(
        output_dir, f'{name}/{quantization}.tflite', model_bytes,
        method=prepared.method_name, tier=model.tier, user=None,
        embedding_dim=model.embedding_dim, quantization=quantization,
    ))
    scorer = _click_scorer(model_bytes=model_bytes)
    expected = reference(sample)
    report.append({
        'model': name, 'tier': model.tier, 'user': None,
        'quantization': quantization, 'file_bytes': len(model_bytes),
        'convert_seconds': seconds,
        'max_abs_logit_difference': float(np.max(np.abs(
            scorer(sample) - expected))),
        'max_abs_logit': float(np.max(np.abs(expected))),
        'eval_users': int(users.size),
        'tf': tf_metrics, 'tflite': metrics_of(scorer),
    })
    print(_report_line(report[-1]), flush=True)
  return entries


def _export_model(prepared, model, output_dir, quantizations, report):
  if model.architecture in click_models.ARCHITECTURES:
    return _export_click_model(prepared, model, output_dir, quantizations,
                               report)
  module = on_device_model.OnDeviceRecommender.from_model_parameters(
      model.architecture, model.params,
      split_first_layer=model.split_first_layer, top_k=_TOP_K.value,
  )
  reference = _Scorer(module=module)
  user_id = (None if model.user is None
             else str(prepared.data.user_ids[model.user]))
  name = export_layout.model_folder(tier=model.tier, user_id=user_id)
  tf_metrics = _ranking_metrics(prepared, model, reference,
                                _EVAL_USERS.value)
  entries = []
  for quantization in quantizations:
    representative_users = None
    if module.takes_user_embedding:
      representative_users = model.eval_user_vectors[:64]
    start = time.perf_counter()
    model_bytes = tflite_conversion.convert_to_tflite(
        module, quantization,
        representative_item_ids=model.representative_items,
        representative_user_embeddings=(
            representative_users if quantization == 'full_integer' else None
        ),
    )
    seconds = time.perf_counter() - start
    entries.append(manifest.write_model_file(
        output_dir, f'{name}/{quantization}.tflite', model_bytes,
        method=prepared.method_name, tier=model.tier,
        user=user_id,
        embedding_dim=model.embedding_dim, quantization=quantization,
    ))
    scorer = _Scorer(model_bytes=model_bytes)
    report.append({
        'model': name,
        'tier': model.tier,
        'user': user_id,
        'quantization': quantization,
        'file_bytes': len(model_bytes),
        'convert_seconds': seconds,
        **_logit_differences(model, reference, scorer),
        'eval_users': int(min(model.eval_users.size,
                              _EVAL_USERS.value or model.eval_users.size)),
        'tf': tf_metrics,
        'tflite': _ranking_metrics(prepared, model, scorer,
                                   _EVAL_USERS.value),
    })
    print(_report_line(report[-1]), flush=True)
  return entries


def _report_line(row) -> str:
  names = sorted(row['tf'])
  tf_text = ' / '.join(f'{row["tf"][k]:.4f}' for k in names)
  lite_text = ' / '.join(f'{row["tflite"][k]:.4f}' for k in names)
  return (
      f'{row["model"]:<16} {row["quantization"]:<13} '
      f'{row["file_bytes"] / 1024:>9.1f} KiB  max |diff| '
      f'{row["max_abs_logit_difference"]:.2e} of |logit| <= '
      f'{row["max_abs_logit"]:.3g}  {" / ".join(names)}: '
      f'TF {tf_text}  TFLite {lite_text}  ({row["eval_users"]} users)'
  )


def _checked_quantizations() -> list[str]:
  """--quantizations, each once, in its order; refuses an empty or
  unknown one."""
  accepted = ', '.join(tflite_conversion.QUANTIZATIONS)
  quantizations = list(dict.fromkeys(_QUANTIZATIONS.value))
  if not quantizations:
    raise exported_models.ExportError(
        '--quantizations is empty, so nothing would be exported: give one '
        f'or more of {accepted}, comma-separated (leave the flag out for '
        'all of them).'
    )
  unknown = [q for q in quantizations
             if q not in tflite_conversion.QUANTIZATIONS]
  if unknown:
    shown = ', '.join(q or '"" (an empty entry)' for q in unknown)
    raise exported_models.ExportError(
        f'Unknown quantization {shown}; choose from {accepted}.'
    )
  return quantizations


def _check_output_dir(output_dir: str) -> None:
  """Refuses an --output_dir that an export cannot replace: a file, or a
  folder holding more than an earlier export (replacing it would delete
  the rest)."""
  if os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise exported_models.ExportError(
        f'--output_dir={output_dir} is a file, not a folder. Give a folder '
        '(it is made if missing).'
    )
  if not os.path.isdir(output_dir):
    return
  foreign = export_layout.foreign_entries(output_dir)
  if foreign:
    shown = ', '.join(foreign[:5]) + (', ...' if len(foreign) > 5 else '')
    raise exported_models.ExportError(
        f'--output_dir={output_dir} holds files that are not an export '
        f'({shown}). An export replaces the whole folder: give a new or '
        'empty folder, or an earlier export\'s. Nothing was written.'
    )


def _write_export(prepared, run_round, models, quantizations, folder
                  ) -> dict:
  """Writes the export into `folder`, checks it against its manifest and
  returns the report."""
  report, entries = [], []
  for model in models:
    # A Ctrl-C that a finalizer swallowed (`interrupts`) stops the export
    # here, before the next model, and before the export replaces the
    # earlier one.
    interrupts.raise_if_received()
    entries += _export_model(prepared, model, folder, quantizations, report)
  interrupts.raise_if_received()
  atomic_files.write_atomically(
      folder / export_layout.ITEM_IDS_NAME,
      json.dumps([str(i) for i in prepared.data.item_ids]),
  )
  manifest.write_manifest(folder, entries)
  result = {
      'root_dir': flags.FLAGS.root_dir,
      'method': prepared.method_name,
      'round': run_round,
      'models': report,
  }
  atomic_files.write_atomically(
      folder / export_layout.REPORT_NAME, json.dumps(result, indent=2)
  )
  if manifest.read_manifest(folder, verify=True) != entries:
    raise manifest.ManifestError(
        f'{folder / manifest.MANIFEST_NAME} reads back other entries than '
        'were written.'
    )
  return result


def export() -> dict:
  """Exports the run of --root_dir; returns the report.

  The export is written beside --output_dir and replaces it only once it
  is complete and checked (`export_directory`): when anything fails, an
  earlier export there is left as it was.
  """
  root_dir = flags.FLAGS.root_dir
  if not root_dir:
    raise exported_models.ExportError('--root_dir (a training run) is required.')
  output_dir = _OUTPUT_DIR.value or os.path.join(root_dir, 'tflite')
  _check_output_dir(output_dir)
  quantizations = _checked_quantizations()
  # A user or tier given twice is exported once.
  requested_users = list(dict.fromkeys(_USERS.value))
  requested_tiers = (None if _TIERS.value is None
                     else list(dict.fromkeys(_TIERS.value)))
  if requested_tiers == [] and not requested_users:
    raise exported_models.ExportError(
        '--tiers is empty and no --users are given, so nothing would be '
        'exported: leave --tiers out for every tier the run trains, or give '
        '--users.'
    )
  _load_run_flags(root_dir)
  prepared = training_program.prepare_run(
      log=lambda line: print(line, flush=True), starting=False)
  tiers_to_export = (exported_models.trained_tiers(prepared)
                     if requested_tiers is None else requested_tiers)
  users = exported_models.user_indices(prepared.data, requested_users) if (
      requested_users) else np.zeros([0], np.int64)
  with execution.worker_execution_context() as worker_pid:
    run = prepared.make_training_run(worker_pid)
    run.restore_or_initialize(create_client_states=False)
    if run.next_round == 0:
      raise exported_models.ExportError(
          f'{root_dir} has no checkpoint yet: train at least one round '
          f'(checkpoints go to {root_dir}/checkpoints).'
      )
    models = [exported_models.tier_model(prepared, run, tier)
              for tier in tiers_to_export]
    models += [exported_models.user_model(prepared, run, int(user))
               for user in users]
  print(f'Exporting {len(models)} model(s) of round {run.next_round} to '
        f'{output_dir}.', flush=True)
  try:
    with export_directory.replaced(output_dir) as staging:
      result = _write_export(prepared, run.next_round, models, quantizations,
                             staging)
  except (OSError, manifest.ManifestError) as error:
    raise exported_models.ExportError(
        f'Writing the export failed: {str(error).rstrip(".")}; '
        f'--output_dir={output_dir} is as it was (an earlier export there '
        'is unchanged).'
    ) from error
  print(f'Wrote {len(result["models"])} model file(s) and '
        f'{manifest.MANIFEST_NAME} to {output_dir}.', flush=True)
  return result


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.WARNING)
  try:
    with interrupts.handled():
      export()
  except KeyboardInterrupt:
    print(
        '\nInterrupted. Nothing was exported: --output_dir is as it was (an '
        'earlier export there is unchanged).',
        file=sys.stderr, flush=True,
    )
    sys.exit(130)
  except (exported_models.ExportError, training_program.FlagError,
          errors.DataFormatError, errors.DatasetFetchError,
          execution.WorkerStartError, manifest.ManifestError,
          ValueError) as error:
    print(f'error: {error}', file=sys.stderr, flush=True)
    sys.exit(2)
