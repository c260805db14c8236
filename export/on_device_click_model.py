"""A device tier's click-through model (RF²'s DLRM or DIN) as a `tf.Module`
with the serving signature a phone app calls, built from its Keras form
(`algorithms.rf2.keras_models.ClickThroughModel`), whose math is the
functional form the clients train with (`algorithms.rf2.models`).

Signature (inputs -> outputs):

- `predict`: `item_ids` int32 [N] (the movies), `genre_ids` int32 [N, G]
  (each movie's genres + 1, 0 pads) and `history_ids` int32 [N, H] (the
  user's last clicked movies + 1, oldest first, 0 pads) -> `logits`
  float32 [N] and `probabilities` float32 [N] (the click probability).

G and H are fixed at construction (those of the training data). A Channel
tier's model is the global model with the tier's masks applied
(`models.apply_masks`): the units it does not keep are zero.

Example:
  >>> module = OnDeviceClickModel(spec, params, genres_width=6,
  ...                             history_length=10)
  >>> module.predict(item_ids=..., genre_ids=..., history_ids=...)
"""

import tensorflow as tf

from tff_fedrec.algorithms.rf2 import keras_models
from tff_fedrec.algorithms.rf2 import models

PREDICT_SIGNATURE = 'predict'


class OnDeviceClickModel(tf.Module):
  """The `predict` signature of one click-through model (module
  docstring)."""

  takes_user_embedding = False

  def __init__(self, spec: models.ClickModelSpec, params, *,
               genres_width: int, history_length: int, name=None):
    super().__init__(name=name)
    self.model = keras_models.from_parameters(spec, params)
    self.predict = tf.function(self._predict, input_signature=[
        tf.TensorSpec([None], tf.int32, name='item_ids'),
        tf.TensorSpec([None, genres_width], tf.int32, name='genre_ids'),
        tf.TensorSpec([None, history_length], tf.int32, name='history_ids'),
    ])

  def _predict(self, item_ids, genre_ids, history_ids):
    logits = self.model({'item': item_ids, 'genres': genre_ids,
                         'history': history_ids})
    return {'logits': logits, 'probabilities': tf.sigmoid(logits)}

  @property
  def signatures(self) -> dict:
    """{'predict': ...}, the concrete function to export."""
    return {PREDICT_SIGNATURE: self.predict.get_concrete_function()}

  @staticmethod
  def inputs(features) -> dict:
    """The signature's inputs of feature rows (`method.FeatureRows.
    features`: item, genres, history)."""
    return {'item_ids': features['item'], 'genre_ids': features['genres'],
            'history_ids': features['history']}
