"""What a method builder returns: the model, its initial values and the process."""

import collections
import dataclasses

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import models
from tff_fedrec.algorithms import user_groups

RoundResult = collections.namedtuple(
    'RoundResult', ['server_state', 'train_loss', 'upload_bytes']
)


def parameter_bytes(params: models.Parameters, keys) -> int:
  """Bytes of the parameters under `keys` (float32 values as sent)."""
  return sum(
      np.asarray(leaf).nbytes
      for key in keys
      for leaf in tf.nest.flatten(params[key])
  )


@dataclasses.dataclass(frozen=True)
class FederatedMethod:
  """A built federated recommendation method with client state.

  Attributes:
    spec: The model and which of its parameters are global / client-local.
    initial_parameters: Initial values of all parameters (numpy).
    initial_client_state: The state of a client that has not trained yet.
    process: `tff.templates.IterativeProcess` with
      next: (<S@SERVER, {L}@CLIENTS, {D}@CLIENTS> -> <S@SERVER, {C}@CLIENTS, M@SERVER>),
      where L is the local-parameter part of the client state C.
  """

  spec: models.RecommenderSpec
  initial_parameters: models.Parameters
  initial_client_state: collections.OrderedDict
  process: tff.templates.IterativeProcess

  def global_parameters(self, server_state) -> collections.OrderedDict:
    return server_state['global_parameters']

  def upload_bytes(self, metrics, num_clients: int) -> int:
    """Bytes the round's clients uploaded, from the aggregator's counts.

    Row-sparse item uploads send an int32 id and d float32 values per row;
    dense parameters (and LDP's noised full table) are sent whole.
    """
    dense_keys = [k for k in self.spec.global_keys if k != 'item_embedding']
    uploaded = parameter_bytes(self.initial_parameters, dense_keys) * num_clients
    item_measurements = metrics['aggregator']['item']
    if 'uploaded_rows' in item_measurements:
      row_bytes = 4 + 4 * self.spec.embedding_dim
      return uploaded + int(item_measurements['uploaded_rows']) * row_bytes
    return uploaded + num_clients * parameter_bytes(
        self.initial_parameters, ['item_embedding']
    )

  def run_round(
      self, server_state, store, users, client_data, examples, *,
      users_per_client: int = 1,
  ):
    """One round of `process.next` for `users`, `users_per_client` of them
    per TFF client (`user_groups`); their new states go to `store`."""
    del examples  # The client data already holds the users' examples.
    server_state, new_states, metrics = user_groups.run_grouped_round(
        self.process,
        server_state,
        store.stacked_local_parameters(np.asarray(users)),
        client_data,
        users_per_client,
    )
    store.put(users, new_states)
    return RoundResult(
        server_state=server_state,
        train_loss=float(metrics['train_loss']),
        upload_bytes=self.upload_bytes(metrics, len(users)),
    )
