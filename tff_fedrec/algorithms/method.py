"""What a method builder returns: the model, its initial values and the process."""

import collections
import dataclasses

import tensorflow_federated as tff

from tff_fedrec import models


@dataclasses.dataclass(frozen=True)
class FederatedMethod:
  """A built federated recommendation method.

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
