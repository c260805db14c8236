"""Runs exported TFLite models in the real `tf.lite.Interpreter`, through the
same signature runners a phone app uses, and compares them with training.

Every function takes the flatbuffer bytes of `tflite_conversion` and, when
the model was exported without a user vector (a HeteFedRec tier's global
model), the user vector as `user_embedding` float32 [d].

Example:
  >>> from tff_fedrec.export import tflite_conversion
  >>> module = on_device_model.OnDeviceRecommender(
  ...     'matrix_factorization', np.eye(3, dtype=np.float32),
  ...     user_embedding=np.array([0.0, 2.0, 1.0], np.float32), top_k=2)
  >>> model = tflite_conversion.convert_to_tflite(module)
  >>> interpreter_scores(model, [1, 2])
  array([2., 1.], dtype=float32)
"""

import numpy as np
import tensorflow as tf
from tensorflow.lite.tools import flatbuffer_utils

from tff_fedrec import metrics
from tff_fedrec.export import on_device_model


def _run(
    interpreter: tf.lite.Interpreter, key: str, user_embedding, **inputs
) -> dict[str, np.ndarray]:
  """Runs signature `key` of `interpreter` on `inputs`, with
  `user_embedding` fed alongside if given."""
  takes_user = 'user_embedding' in interpreter.get_signature_list()[key][
      'inputs'
  ]
  if takes_user != (user_embedding is not None):
    raise ValueError(
        'This model '
        + ('takes' if takes_user else 'has no')
        + ' user_embedding input; pass user_embedding '
        + ('[d].' if takes_user else 'None.')
    )
  if user_embedding is not None:
    inputs['user_embedding'] = np.asarray(user_embedding, np.float32)
  return interpreter.get_signature_runner(key)(**inputs)


def interpreter_scores(
    model_bytes: bytes, item_ids, user_embedding=None
) -> np.ndarray:
  """The `score` signature's logits, float32 [C], of item ids int [C]."""
  return _run(
      tf.lite.Interpreter(model_content=model_bytes),
      on_device_model.SCORE_SIGNATURE,
      user_embedding,
      item_ids=np.asarray(item_ids, np.int32),
  )['scores']


def interpreter_top_k(
    model_bytes: bytes, exclude_ids, user_embedding=None
) -> tuple[np.ndarray, np.ndarray]:
  """The `top_k` signature's (item ids int32 [K], scores float32 [K]), best
  first, for exclude_ids int [E] (E may be 0)."""
  outputs = _run(
      tf.lite.Interpreter(model_content=model_bytes),
      on_device_model.TOP_K_SIGNATURE,
      user_embedding,
      exclude_ids=np.asarray(exclude_ids, np.int32),
  )
  return outputs['item_ids'], outputs['scores']


def max_score_difference(
    model_bytes: bytes,
    module: on_device_model.OnDeviceRecommender,
    item_ids,
    user_embedding=None,
) -> float:
  """max_j |TFLite score_j - TF score_j| over item ids int [C], the TF score
  from `module.score`, the model `model_bytes` was converted from."""
  tf_inputs = [tf.constant(item_ids, tf.int32)]
  if user_embedding is not None:
    tf_inputs.append(tf.constant(user_embedding, tf.float32))
  expected = module.score(*tf_inputs)['scores'].numpy()
  actual = interpreter_scores(model_bytes, item_ids, user_embedding)
  return float(np.max(np.abs(actual - expected)))


def ranking_metrics_with_interpreter(
    model_bytes: bytes,
    test_items,
    negative_items,
    *,
    user_embeddings=None,
    k: int = 10,
) -> dict[str, float]:
  """HR@K and NDCG@K of leave-one-out ranking, scored by the interpreter.

  Each case's test item is ranked among its M sampled negatives (M = 99 in
  NCF's and PFedRec's protocol) by the `score` signature; the formulas and
  tie rule are `tff_fedrec.metrics.sampled_rank`, `hit_ratio_at_k` and
  `ndcg_at_k`: with the 1-based rank r, HR = [r <= K] and NDCG =
  [r <= K] / log2(r + 1), averaged over cases. Larger is better.

  Args:
    model_bytes: The TFLite model.
    test_items: int [U], one held-out item per case.
    negative_items: int [U, M], the sampled negatives of each case.
    user_embeddings: float32 [U, d], each case's user vector, for a model
      that takes `user_embedding`; None for a model with its user baked in.
    k: The cut-off K.

  Returns:
    {'hr@K': ..., 'ndcg@K': ...}.
  """
  test_items = np.asarray(test_items, np.int32)
  negative_items = np.asarray(negative_items, np.int32)
  if negative_items.ndim != 2 or test_items.shape != negative_items.shape[:1]:
    raise ValueError(
        'test_items must be [U] and negative_items [U, M]; got '
        f'{test_items.shape} and {negative_items.shape}.'
    )
  if user_embeddings is None:
    users = [None] * len(test_items)
  else:
    users = np.asarray(user_embeddings, np.float32)
    if len(users) != len(test_items):
      raise ValueError(
          f'{len(users)} user_embeddings for {len(test_items)} test items.'
      )
  # Column 0 the test item, as `metrics.sampled_rank` expects.
  candidates = np.concatenate([test_items[:, None], negative_items], axis=1)
  interpreter = tf.lite.Interpreter(model_content=model_bytes)
  scores = np.stack([
      _run(
          interpreter, on_device_model.SCORE_SIGNATURE, user, item_ids=items
      )['scores']
      for items, user in zip(candidates, users)
  ])
  ranks = metrics.sampled_rank(scores)
  return {
      f'hr@{k}': metrics.hit_ratio_at_k(ranks, k),
      f'ndcg@{k}': metrics.ndcg_at_k(ranks, k),
  }


def float_operators(model_bytes: bytes) -> set[str]:
  """Names of the builtin ops that compute in floating point, i.e. have a
  float32 or float16 output, other than DEQUANTIZE (which only converts
  quantized tensors to float). Empty for a model whose arithmetic is all
  integer."""
  model = flatbuffer_utils.convert_bytearray_to_object(bytearray(model_bytes))
  float_types = {'FLOAT32', 'FLOAT16'}
  names = set()
  for subgraph in model.subgraphs:
    for operator in subgraph.operators:
      name = flatbuffer_utils.opcode_to_name(model, operator.opcodeIndex)
      outputs = [subgraph.tensors[index] for index in operator.outputs]
      if name != 'DEQUANTIZE' and any(
          flatbuffer_utils.type_to_name(tensor.type) in float_types
          for tensor in outputs
      ):
        names.add(name)
  return names
