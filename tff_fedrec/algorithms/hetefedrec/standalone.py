"""'Standalone' (HeteFedRec Sec. V.C): every client trains its own model alone.

"This baseline assigns heterogeneous recommendation models to clients based
on their data amounts. Each client independently trains its model without
collaboration or knowledge sharing with other clients." A client of tier a
owns a whole model of its tier, {u_i, V_a^i, Theta_a^i}, starting from the
same initial tier model as HeteFedRec (`hetero_models.initial_parameters`),
and each round it is selected takes one Adam step (`HeteroConfig.learning_rate`) of
Eq. 2's loss on its own data (Algorithm 1 lines 16-26 without the upload).
Nothing is aggregated and nothing is sent; the models are client state.

The process is `composer.compose_client_state_process` with no global
parameters: a broadcast of nothing, `build_client_work`, an aggregator of
the empty update and `finalizers.ApplyDelta` of it. Types (U users of one
tier per TFF client, see `templates.user_groups`; N is the tier's width,
left unknown so one process serves every tier):

  L = <model: <user [U, N], item_table [U, I, N],
               score_layers: [<kernel [U, f_in, f_out], bias [U, f_out]>, ...]>,
       adam_m: like model, adam_v: like model, adam_step [U]>
  D = `process.client_data_type()` (`include` and `validation` are
  ignored)
  upload = <update=<>, weight=U, metrics=<loss_sum, num_examples>>

Example (one client of the small tier, users of a 5-item catalogue):
  >>> spec = hetero_models.HeteroSpec(num_items=5, widths=(2, 4, 8))
  >>> process = build_standalone_process(spec, learning_rate=0.01)
  >>> models = initial_personal_models(
  ...     spec, hetero_models.initial_parameters(spec, 0), tier=0,
  ...     user_embeddings=np.zeros([3, 8], np.float32))
  >>> models['model']['item_table'].shape
  (3, 5, 2)
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import adam
from tff_fedrec.aggregators import keyed
from tff_fedrec.algorithms.hetefedrec import dual_task
from tff_fedrec.algorithms.hetefedrec import models as hetero_models
from tff_fedrec.algorithms.hetefedrec import process as hetefedrec_process
from tff_fedrec.templates import composer
from tff_fedrec.templates import distributors
from tff_fedrec.templates import finalizers
from tff_fedrec.templates import roles
from tff_fedrec.templates import two_phase


def local_state_type(spec: hetero_models.HeteroSpec) -> tff.Type:
  """L of the module docstring."""
  num_layers = len(spec.hidden_units) + 1
  model = collections.OrderedDict(
      user=tff.TensorType(np.float32, [None, None]),
      item_table=tff.TensorType(np.float32, [None, spec.num_items, None]),
      score_layers=[
          collections.OrderedDict(
              kernel=tff.TensorType(np.float32, [None, None, None]),
              bias=tff.TensorType(np.float32, [None, None]),
          )
          for _ in range(num_layers)
      ],
  )
  return tff.to_type(
      collections.OrderedDict(
          model=model,
          adam_m=model,
          adam_v=model,
          adam_step=tff.TensorType(np.float32, [None]),
      )
  )


def initial_personal_models(
    spec: hetero_models.HeteroSpec,
    initial_parameters: collections.OrderedDict,
    *,
    tier: int,
    user_embeddings: np.ndarray,
) -> collections.OrderedDict:
  """L (numpy) of the tier's users before their first round: copies of the
  tier's initial model, each user with its own embedding (the first N_a
  entries of `user_embeddings` [users, >= N_a])."""
  num_users = user_embeddings.shape[0]
  width = spec.widths[tier]
  repeat = lambda x: np.repeat(np.asarray(x)[None], num_users, axis=0)
  model = collections.OrderedDict(
      user=np.array(user_embeddings[:, :width], np.float32),
      item_table=repeat(initial_parameters['item_tables'][tier]),
      score_layers=[
          collections.OrderedDict((k, repeat(v)) for k, v in layer.items())
          for layer in initial_parameters['score_layers'][tier]
      ],
  )
  return collections.OrderedDict(
      model=model,
      adam_m=tf.nest.map_structure(np.zeros_like, model),
      adam_v=tf.nest.map_structure(np.zeros_like, model),
      adam_step=np.zeros([num_users], np.float32),
  )


def _per_user_adam(params, grads, m, v, step, learning_rate):
  """`adam.apply` with one step count per user (leading dimension)."""
  new_params, new_m, new_v = [], [], []
  for x, g, x_m, x_v in zip(*map(tf.nest.flatten, (params, grads, m, v))):
    leaf_step = tf.reshape(step, [-1] + [1] * (x.shape.rank - 1))
    x, state = adam.apply(
        x, g, adam.AdamState(m=x_m, v=x_v, step=leaf_step),
        learning_rate=learning_rate,
    )
    new_params.append(x)
    new_m.append(state.m)
    new_v.append(state.v)
  pack = lambda flat: tf.nest.pack_sequence_as(params, flat)
  return pack(new_params), pack(new_m), pack(new_v), step + 1.0


def build_standalone_process(
    spec: hetero_models.HeteroSpec, learning_rate: float
) -> two_phase.TwoPhaseProcess:
  """Builds the process of the module docstring."""
  num_tiers = len(spec.widths)
  local_type = local_state_type(spec)
  data_type = tff.to_type(hetefedrec_process.client_data_type())
  distributor = distributors.Broadcast()
  received_type = distributor.received_type(
      tff.to_type(collections.OrderedDict())
  )

  def tier_branch(tier, local, data):

    def run():
      model = local['model']
      row_mask = tf.sequence_mask(
          data['num_rows'], tf.shape(data['row_ids'])[1], tf.float32
      )
      example_mask = tf.sequence_mask(
          data['num_examples'], tf.shape(data['items'])[1], tf.float32
      )
      with tf.GradientTape() as tape:
        tape.watch(model)
        rows = tf.gather(model['item_table'], data['row_ids'], batch_dims=1)
        losses = dual_task.client_losses(
            dual_task.TierObjective(
                spec, tier, dual_task=False, decorrelation_weight=0.0),
            model['user'], rows, {tier: model['score_layers']},
            dual_task.ClientExamples(
                row_mask, data['items'], data['labels'], example_mask),
        )
        total = tf.reduce_sum(losses.total)
      grads = tape.gradient(
          total, model, unconnected_gradients=tf.UnconnectedGradients.ZERO
      )
      grads = tf.nest.map_structure(tf.convert_to_tensor, grads)
      new_model, m, v, step = _per_user_adam(
          model, grads, local['adam_m'], local['adam_v'], local['adam_step'],
          learning_rate,
      )
      new_local = collections.OrderedDict(
          model=new_model, adam_m=m, adam_v=v, adam_step=step
      )
      return new_local, tf.reduce_sum(losses.own_tier), tf.reduce_sum(
          example_mask
      )

    return run

  @tff.tensorflow.computation(received_type, local_type, data_type)
  def client_update(received, local, data):
    del received  # Nothing is shared.
    new_local, loss_sum, num_examples = tf.switch_case(
        data['tier'], [tier_branch(t, local, data) for t in range(num_tiers)]
    )
    return new_local, collections.OrderedDict(
        update=collections.OrderedDict(),
        weight=tf.cast(tf.shape(data['num_rows'])[0], tf.float32),
        metrics=collections.OrderedDict(
            loss_sum=loss_sum, num_examples=num_examples
        ),
    )

  @tff.tensorflow.computation
  def no_global_parameters():
    return collections.OrderedDict()

  return composer.compose_client_state_process(
      initial_global_parameters=no_global_parameters,
      distributor=distributor,
      client_work=roles.client_work(client_update),
      aggregator=keyed.KeyedFactory(collections.OrderedDict()).create(
          tff.to_type(collections.OrderedDict()), tff.TensorType(np.float32)
      ),
      finalizer=finalizers.ApplyDelta(),
  )
