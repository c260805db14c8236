"""What the server sends its clients each round: the generic distributor.

A distributor plays `roles.Distributor`:
  initial_state: a `tff.tensorflow.computation` ( -> its server state);
  received_type(global_type): B, the type of what a client receives when
    the global parameters have type `global_type`;
  distribute(server_state): called while tracing the client step; returns
    B@CLIENTS, what every client receives (always holding
    `global_parameters` and `round_num`);
  record(state, aggregate, new_global, round_num): called while tracing the
    server step after the finalizer; returns (new state, measurements),
    both SERVER-placed.

`Broadcast` sends the global parameters as they are. A method's own
distributor (a compressed downlink, a teacher beside the model) lives in
its package under `algorithms/`.
"""

import collections

import numpy as np
import tensorflow_federated as tff

from tff_fedrec.templates import finalizers


@tff.tensorflow.computation
def _no_state():
  return collections.OrderedDict()


class Broadcast:
  """B = <global_parameters, round_num>, the same for every client."""

  initial_state = _no_state

  def received_type(self, global_type) -> tff.Type:
    return tff.to_type(collections.OrderedDict(
        global_parameters=global_type, round_num=np.int32
    ))

  def distribute(self, server_state):
    return tff.federated_broadcast(tff.federated_zip(collections.OrderedDict(
        global_parameters=server_state.global_parameters,
        round_num=server_state.round_num,
    )))

  def record(self, state, aggregate, new_global, round_num):
    del aggregate, new_global, round_num  # Nothing is kept.
    return state, finalizers.no_measurements()
