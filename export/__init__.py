"""On-device export of trained models (installed as `tff_fedrec.export`).

- `on_device_model`: one user's recommender as a `tf.Module` with the
  `score` and `top_k` serving signatures, from numpy parameters.
- `tflite_conversion`: that module as TFLite bytes, in float32, float16,
  dynamic-range or full-integer quantization.
- `interpreter_checks`: runs the bytes in `tf.lite.Interpreter` and compares
  them with training (scores, top-K, HR@K / NDCG@K).
- `manifest`: the JSON list of exported files with sizes and SHA-256.
"""
