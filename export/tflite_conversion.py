"""TFLite flatbuffers of an `OnDeviceRecommender`, in four quantizations.

The module is saved as a SavedModel with its `score` and `top_k` signatures
and converted with `tf.lite.TFLiteConverter.from_saved_model`, which keeps
the signature keys, so `Interpreter.get_signature_runner('score')` and
`('top_k')` work on every variant. Inputs and outputs stay int32 ids and
float32 scores / user vectors in every variant, so one app code path serves
them all.

`QUANTIZATIONS` (post-training quantization, TFLite's model optimization
guide):

- 'float32': no quantization.
- 'float16': weights stored as float16 and dequantized to float32 when
  the model is loaded (`target_spec.supported_types = [tf.float16]`).
- 'dynamic_range': weight tensors of >= 1024 elements stored as int8 with
  per-channel scales; activations stay float (`Optimize.DEFAULT`).
- 'full_integer': weights and activations int8, with activation ranges
  calibrated on a representative data set built from the given item ids
  (the user's own items): `score` sees them, `top_k` sees them excluded.
  Builtins are int8 where TFLite has an int8 kernel
  (`OpsSet.TFLITE_BUILTINS_INT8`), else float (`OpsSet.TFLITE_BUILTINS`).
  In TF 2.14 no op of these models falls back to float (checked by
  converting every architecture and reading the op types, see
  `interpreter_checks.float_operators`): GATHER, FULLY_CONNECTED,
  BATCH_MATMUL (FedMF with a user input), ADD (with ReLU fused), TILE,
  CONCATENATION, RESHAPE, STRIDED_SLICE and TOPK_V2 all run in int8; a
  QUANTIZE takes the float `user_embedding` input to int8 and a DEQUANTIZE
  gives float32 scores. The id bookkeeping of `top_k` (SCATTER_ND, EQUAL,
  WHERE, the GATHERs of ids) is int32 / bool in every variant. A baked-in
  user's `top_k` scores are one folded constant [I], stored as int8.
  Activations outside the calibrated ranges are clipped, so `score` is
  accurate only for items like the calibration items: calibrate on
  `np.arange(I)` when the app scores arbitrary items (e.g. sampled
  negatives). On the FedNCF model below, `score`'s largest error over all
  items was 18% of the score spread when calibrated on 100 items and 3-4%
  when calibrated on all. int8 scores also tie far more often than float
  ones.

Sizes, for FedNCF with 3706 items, d = 32 and an MLP of (32, 16, 8): with
the user baked in, 509 kB (float32), 261 kB (float16), 148 kB
(dynamic_range) and 136 kB (full_integer). With `user_embedding` as input,
dynamic_range is the largest (610 kB): TF 2.14 stores the item table as
int8 where `score`'s GATHER reads it but keeps a float32 copy for `top_k`'s
CONCATENATION; prefer float16 or full_integer for such models.
full_integer calibrated on a subset of the items stores a second int8 copy
of the table (254 kB for 100 items, 136 kB for all items).

Accuracy, as max |TFLite score - TF logit| over all items divided by the
spread (max - min) of the TF logits, on small random models of every
architecture (d = 8 to 32, 120 to 300 items, calibrated on all items): below
1e-6 for float32, 1e-3 for float16, 1.2e-2 for dynamic_range and 2.4e-2 for
full_integer; the tests allow 1e-5, 2e-3, 3e-2 and 5e-2.
"""

from collections.abc import Sequence
import tempfile

import numpy as np
import tensorflow as tf

from tff_fedrec.export import on_device_model

QUANTIZATIONS = ('float32', 'float16', 'dynamic_range', 'full_integer')


def _representative_dataset(
    module: on_device_model.OnDeviceRecommender,
    item_ids: Sequence[int] | None,
    user_embeddings: np.ndarray | None,
):
  """A generator function of (signature key, inputs) calibration samples:
  per user vector (or once, if the module bakes one in), the items scored
  by `score` and excluded by `top_k`."""
  if item_ids is None or len(item_ids) == 0:
    raise ValueError('full_integer needs representative_item_ids.')
  item_ids = np.asarray(item_ids, dtype=np.int32)
  if module.takes_user_embedding:
    if user_embeddings is None or len(user_embeddings) == 0:
      raise ValueError(
          'full_integer of a module that takes user_embedding needs '
          'representative_user_embeddings [N, d].'
      )
    users = [
        {'user_embedding': user}
        for user in np.asarray(user_embeddings, dtype=np.float32)
    ]
  elif user_embeddings is not None:
    raise ValueError(
        'representative_user_embeddings given, but the module takes no '
        'user_embedding.'
    )
  else:
    users = [{}]

  def samples():
    for user in users:
      yield on_device_model.SCORE_SIGNATURE, {'item_ids': item_ids, **user}
      yield on_device_model.TOP_K_SIGNATURE, {'exclude_ids': item_ids, **user}

  return samples


def convert_to_tflite(
    module,
    quantization: str = 'float32',
    *,
    representative_item_ids: Sequence[int] | None = None,
    representative_user_embeddings: np.ndarray | None = None,
    representative_samples=None,
) -> bytes:
  """The TFLite flatbuffer of `module` with its signatures ('score' and
  'top_k' of an `OnDeviceRecommender`, 'predict' of an
  `on_device_click_model.OnDeviceClickModel`).

  Args:
    module: The model to convert (a module with `signatures`).
    quantization: One of `QUANTIZATIONS` (module docstring).
    representative_item_ids: int [N] ids in [0, I) to calibrate
      'full_integer' on (the user's own items, or all items, see above);
      required for it, ignored otherwise.
    representative_user_embeddings: float32 [U, d]; for 'full_integer' of a
      module that takes `user_embedding`, one calibration sample per row.
    representative_samples: For 'full_integer' of any other module (a
      click-through model's `predict`): a generator function of
      (signature key, inputs) calibration samples, used instead of the
      two above.

  Returns:
    The model, ready for `tf.lite.Interpreter(model_content=...)`.
  """
  if quantization not in QUANTIZATIONS:
    raise ValueError(
        f'Unknown quantization {quantization!r}; expected one of '
        f'{QUANTIZATIONS}.'
    )
  with tempfile.TemporaryDirectory() as saved_model_dir:
    signatures = module.signatures
    tf.saved_model.save(module, saved_model_dir, signatures=signatures)
    converter = tf.lite.TFLiteConverter.from_saved_model(
        saved_model_dir, signature_keys=list(signatures)
    )
    if quantization != 'float32':
      converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if quantization == 'float16':
      converter.target_spec.supported_types = [tf.float16]
    if quantization == 'full_integer':
      converter.representative_dataset = (
          representative_samples or _representative_dataset(
              module, representative_item_ids,
              representative_user_embeddings))
      converter.target_spec.supported_ops = [
          tf.lite.OpsSet.TFLITE_BUILTINS_INT8,
          tf.lite.OpsSet.TFLITE_BUILTINS,
      ]
    return converter.convert()
