"""Program logic of 'Standalone' (HeteFedRec Sec. V.C): the tiered protocol
of `hetero_training_loop` with every user's whole model as client state.

The store keeps one stack of models per data tier (`standalone.
initial_personal_models`: a tier-a user's u_i [N_a], V_a^i [I, N_a],
Theta_a^i and their Adam moments), indexed by the user's position within
its tier. On ML-1M (3,706 items, 5:3:2 tiers of widths 8/16/32) the models
and moments take 3 x 1.36 GB, so the preset checkpoints once per epoch.
"""

import collections
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_fedrec import hetero_models
from tff_fedrec import tiers
from tff_fedrec.algorithms import standalone
from tff_fedrec.programs import hetero_training_loop


class StandaloneTrainingRun(hetero_training_loop.HeteroTrainingRun):
  """A `HeteroTrainingRun` whose users train and keep models of their own."""

  def _initial_local(self) -> collections.OrderedDict:
    spec = self._method.spec
    embeddings = hetero_models.initial_user_embeddings(
        spec, self._data.num_users, self._config.seed
    )
    self._position = np.zeros([self._data.num_users], np.int64)
    local = collections.OrderedDict()
    for tier, name in enumerate(tiers.TIER_NAMES):
      users = np.flatnonzero(self.data_tier == tier)
      self._position[users] = np.arange(users.size)
      local[name] = standalone.initial_personal_models(
          spec, self._method.initial_parameters, tier=tier,
          user_embeddings=embeddings[users],
      )
    return local

  def _tier_models(self, users):
    """The tier store holding `users` (all of one tier) and their rows."""
    name = tiers.TIER_NAMES[self.data_tier[users[0]]]
    return self.local[name], self._position[users]

  def _group_local(self, users) -> collections.OrderedDict:
    store, rows = self._tier_models(users)
    return tf.nest.map_structure(lambda x: x[rows], store)

  def _store_group_local(self, users, local) -> None:
    store, rows = self._tier_models(users)

    def assign(stored, value):
      stored[rows] = np.asarray(value)

    tf.nest.map_structure(
        assign, store, tf.nest.pack_sequence_as(store, tf.nest.flatten(local))
    )

  def user_model(self, data_tier, users, train_offsets, train_items):
    """Each user's own model: (user vectors [U, N], tables [U, I, N],
    score layers with a leading [U]); the training items (CSR) are
    Fed-LightGCN's local graphs."""
    del data_tier  # The users' own models know their width.
    store, rows = self._tier_models(users)
    models = tf.nest.map_structure(lambda x: x[rows], store['model'])
    user = self._user_representation(
        models['user'], models['item_table'], train_offsets, train_items
    )
    return user, models['item_table'], models['score_layers']

  def _large_table(self) -> Optional[np.ndarray]:
    """No global V_l: Table V's variance is not defined for Standalone."""
    return None
