"""A toy process for the tests of roles: three users upload given vectors.

Every process here is composed from a distributor (a broadcast by
default), a toy client work whose users upload a given vector, a keyed
aggregation and the finalizer under test, so a test of a finalizer or a
distributor (generic, or a method's own) can write the expected server states
out with numpy. Two TFF clients: one of two users, one of one user; each
uploads its users' mean with weight U, so the aggregate is the mean over
the three users, `MEAN`.

Example:
  >>> process = build(finalizers.ApplyDelta())
  >>> state, new_locals, metrics = process.next(
  ...     process.initialize(), LOCALS, DATA)
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec.aggregators import keyed
from tff_fedrec.templates import composer
from tff_fedrec.templates import distributors
from tff_fedrec.templates import roles

GLOBAL = collections.OrderedDict(w=np.array([1.0, -2.0], np.float32))
DATA_TYPE = collections.OrderedDict(
    upload=tff.TensorType(np.float32, [None, 2]),
    loss=tff.TensorType(np.float32, [None]),
)
LOCALS = [np.array([0.0, 10.0], np.float32), np.array([5.0], np.float32)]
DATA = [
    collections.OrderedDict(
        upload=np.array([[1.0, 1.0], [3.0, -1.0]], np.float32),
        loss=np.array([0.5, 1.5], np.float32)),
    collections.OrderedDict(
        upload=np.array([[4.0, 2.0]], np.float32),
        loss=np.array([3.0], np.float32)),
]
# (2 x [2, 0] + 1 x [4, 2]) / 3, the mean over the three users.
MEAN = np.array([8.0 / 3.0, 2.0 / 3.0], np.float32)


def initial(params):
  """( -> params), a computation of constants."""

  @tff.tensorflow.computation
  def initial_parameters():
    return tf.nest.map_structure(tf.constant, params)

  return initial_parameters


def mean_upload(received, data):
  """<w = the users' mean upload>, a delta of GLOBAL's `w`."""
  del received
  return collections.OrderedDict(w=tf.reduce_mean(data['upload'], axis=0))


def client_work(received_type, upload=mean_upload, new_local=None):
  """Users upload `upload(received, data)`; each adds the round number and
  the first global entry to its local state (or `new_local(received,
  local)`)."""

  @tff.tensorflow.computation(
      received_type, tff.TensorType(np.float32, [None]), DATA_TYPE,
  )
  def client_update(received, local, data):
    users = tf.cast(tf.shape(local)[0], tf.float32)
    if new_local is None:
      first = tf.reshape(
          tf.nest.flatten(received['global_parameters'])[0], [-1])[0]
      state = local + tf.cast(received['round_num'], tf.float32) + first
    else:
      state = new_local(received, local)
    metrics = collections.OrderedDict(
        loss_sum=tf.reduce_sum(data['loss']), num_examples=users)
    return state, collections.OrderedDict(
        update=upload(received, data), weight=users, metrics=metrics)

  return roles.client_work(client_update)


def build(finalizer, params=GLOBAL, upload=mean_upload, factory=None,
          distributor=None, new_local=None):
  """The toy process with `finalizer` (module docstring); `factory`
  aggregates the uploads (default: a mean of `w`)."""
  initial_parameters = initial(params)
  distributor = distributor or distributors.Broadcast()
  work = client_work(
      distributor.received_type(initial_parameters.type_signature.result),
      upload, new_local,
  )
  factory = factory or keyed.KeyedFactory(collections.OrderedDict(
      w=tff.aggregators.MeanFactory()))
  return composer.compose_client_state_process(
      initial_global_parameters=initial_parameters,
      distributor=distributor,
      client_work=work,
      aggregator=factory.create(
          work.upload_type.update, tff.TensorType(np.float32)),
      finalizer=finalizer,
  )
