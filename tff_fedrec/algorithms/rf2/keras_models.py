"""DLRM and DIN as Keras models for phones and TFLite (`export/
on_device_click_model`): TF Recommenders' `DotInteraction` and `MLP`
blocks, and DIN's layers (`Dice`, `LocalActivationUnit`), which TFRS does
not have.

The clients train the functional form (`models.logits`, a function of the
parameters, so each user of a group takes its own gradient of the
broadcast model inside the client computation); `ClickThroughModel` holds
the same parameters as Keras variables (`set_parameters` takes the
functional nest, Channel's masks applied or not) and computes the same
logits, which `keras_models_test` checks against `models.logits` and the
numpy transcription of the authors' code. The top MLP is
`tfrs.layers.blocks.MLP([hidden, 1])`: its last Dense layer's bias is the
code's separate scalar bias after a bias-free output layer.

Example:
  >>> model = ClickThroughModel(spec)
  >>> model.set_parameters(params)
  >>> model({'item': item, 'genres': genres, 'history': history})  # logits
"""

import numpy as np
import tensorflow as tf
import tensorflow_recommenders as tfrs

from tff_fedrec.algorithms.rf2 import models


class Dice(tf.keras.layers.Layer):
  """Dice without normalisation (`models.dice`), alpha per unit from 0."""

  def build(self, input_shape):
    self.alpha = self.add_weight(name='alpha', shape=[input_shape[-1]],
                                 initializer='zeros')
    super().build(input_shape)

  def call(self, x):
    return models.dice(x, self.alpha)


class LocalActivationUnit(tf.keras.layers.Layer):
  """DIN's attention weight of each history entry for a query: the MLP on
  [q, k, q - k, q * k] with Dice, then one unit (`models._attend`)."""

  def __init__(self, hidden_units, **kwargs):
    super().__init__(**kwargs)
    self.hidden = [tf.keras.layers.Dense(units) for units in hidden_units]
    self.dice = [Dice() for _ in hidden_units]
    self.output_layer = tf.keras.layers.Dense(1)

  def call(self, query, keys):
    """query [B, d], keys [B, H, d] -> scores [B, H]."""
    x = models.local_activation_input(query, keys)
    for dense, dice in zip(self.hidden, self.dice):
      x = dice(dense(x))
    return self.output_layer(x)[..., 0]


class ClickThroughModel(tf.keras.Model):
  """`spec`'s model (`models` module docstring) as Keras layers."""

  def __init__(self, spec: models.ClickModelSpec, **kwargs):
    super().__init__(**kwargs)
    self.spec = spec
    d = spec.embedding_dim
    self.item_embedding = tf.keras.layers.Embedding(spec.num_items, d)
    self.genre_embedding = tf.keras.layers.Embedding(spec.num_genres + 1, d)
    self.history_embedding = tf.keras.layers.Embedding(spec.num_items + 1, d)
    for table in (self.item_embedding, self.genre_embedding,
                  self.history_embedding):
      table.build(None)  # Pooling reads the tables, not the layer's call.
    self.top = tfrs.layers.blocks.MLP([spec.hidden_units, 1])
    if spec.architecture == 'dlrm':
      self.interaction = tfrs.layers.feature_interaction.DotInteraction(
          self_interaction=False)
    else:
      self.attention = LocalActivationUnit(spec.attention_units)
    # Builds every layer (their widths do not depend on G and H).
    self({'item': tf.zeros([1], tf.int32),
          'genres': tf.zeros([1, 1], tf.int32),
          'history': tf.zeros([1, 1], tf.int32)})

  def call(self, features):
    """Logits [B] of `features` (item [B], genres [B, G], history
    [B, H])."""
    item = self.item_embedding(features['item'])
    genres = models.mean_pool(self.genre_embedding.embeddings,
                              features['genres'])
    ids = features['history']
    if self.spec.architecture == 'dlrm':
      history = models.mean_pool(self.history_embedding.embeddings, ids)
      return self.top(self.interaction([item, genres, history]))[:, 0]
    keys = self.history_embedding(ids)
    history = models.attention_pool(self.attention(item, keys), keys,
                                    ids > 0)
    return self.top(tf.concat([item, genres, history], axis=-1))[:, 0]

  def set_parameters(self, params) -> None:
    """Assigns the functional parameters (`models.initial_parameters`'
    nest)."""
    params = tf.nest.map_structure(np.asarray, params)
    self.item_embedding.set_weights([params['item_embedding']])
    self.genre_embedding.set_weights([params['genre_embedding']])
    self.history_embedding.set_weights([params['history_embedding']])
    top = params['top_mlp' if self.spec.architecture == 'dlrm' else 'mlp']
    hidden, output = self.top._sublayers  # pylint: disable=protected-access
    hidden.set_weights([top['hidden_kernel'], top['hidden_bias']])
    output.set_weights([top['output_kernel'], top['output_bias']])
    if self.spec.architecture == 'din':
      attention = params['attention']
      for layer, (dense, dice) in enumerate(zip(self.attention.hidden,
                                                self.attention.dice)):
        dense.set_weights([attention[f'kernel_{layer}'],
                           attention[f'bias_{layer}']])
        dice.set_weights([attention[f'dice_{layer}']])
      self.attention.output_layer.set_weights(
          [attention['output_kernel'], attention['output_bias']])


def from_parameters(spec: models.ClickModelSpec,
                    params) -> ClickThroughModel:
  """A `ClickThroughModel` holding `params`."""
  model = ClickThroughModel(spec)
  model.set_parameters(params)
  return model
