"""FedRecon (Singhal et al., NeurIPS 2021) with TFF's own `build_fed_recon`.

PFedRec's baseline "tested under the matrix factorization scenario" (Sec.
6.2): logit <p_u, q_j>, the item embedding q global, the user embedding p_u
local and never stored. Every round each client reconstructs p_u from the
same starting value on its data with q frozen (reconstruction optimizer),
then trains q with p_u frozen (client optimizer); the server averages the
clients' updates of q. The process is `tff.learning.algorithms.
build_fed_recon`'s `LearningProcess`, fed one `tf.data.Dataset` per client
(TFF's reconstruction API takes datasets), with uniform client weighting (the
unweighted average of PFedRec's Algorithm 1, line 6).

Evaluation reconstructs every user's p_u the same way on its training
examples (`reconstruction`) and scores with the result. With
dual personalization (PFedRec Table 3) each user also keeps the item rows its
post-reconstruction step fine-tuned (`reconstruction.fine_tune_item_rows`)
and scores with them; the federated training itself is unchanged, as FedRecon
already alternates between the local and the global parameters.

Example:
  >>> method = build_fedrecon(data=run_data, embedding_dim=32, seed=0)
  >>> method.spec.local_keys
  ('user_embedding',)
"""

import collections
import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import models
from tff_fedrec.algorithms import method
from tff_fedrec.algorithms.fedrecon import reconstruction
from tff_fedrec.algorithms.local_items import client_training
from tff_fedrec.algorithms.local_items import exchanges
from tff_fedrec.algorithms.local_items import item_method
from tff_fedrec.algorithms.local_items import personal_rows


class _UserEmbedding(tf.keras.layers.Layer):
  """The client's p_u [d], repeated for every example of a batch."""

  def __init__(self, initial_value: np.ndarray, **kwargs):
    super().__init__(**kwargs)
    self._initial_value = np.asarray(initial_value, np.float32)

  def build(self, input_shape):
    self.embedding = self.add_weight(
        name='user_embedding',
        shape=self._initial_value.shape,
        initializer=tf.keras.initializers.Constant(self._initial_value),
    )

  def call(self, items):
    return tf.broadcast_to(
        self.embedding, [tf.shape(items)[0], self._initial_value.size]
    )


def _keras_model(params: models.Parameters):
  """A Keras MF model on item ids, and its (item, user) layers."""
  num_items, dim = params['item_embedding'].shape
  items = tf.keras.Input(shape=(), dtype=tf.int32)
  item_layer = tf.keras.layers.Embedding(
      num_items,
      dim,
      embeddings_initializer=tf.keras.initializers.Constant(
          params['item_embedding']
      ),
  )
  user_layer = _UserEmbedding(params['user_embedding'])
  logits = tf.reduce_sum(item_layer(items) * user_layer(items), axis=-1)
  return tf.keras.Model(inputs=items, outputs=logits), item_layer, user_layer


@dataclasses.dataclass(frozen=True)
class ReconstructionMethod(item_method.ItemTableMethod):
  """A built FedRecon method (a `method.Method`).

  `process` is a `tff.learning.templates.LearningProcess`:
  next: (<S@SERVER, {D*}@CLIENTS> -> <S@SERVER, M@SERVER>). The store
  holds each user's reconstructed p_u (and fine-tuned rows).
  """

  spec: models.RecommenderSpec
  initial_parameters: models.Parameters
  process: tff.learning.templates.LearningProcess
  training: client_training.ClientTrainingConfig
  num_users: int

  def initial_store(self) -> personal_rows.PersonalRowsStore:
    return personal_rows.PersonalRowsStore(
        self.num_users,
        client_training.initial_client_state(
            self.spec, self.initial_parameters,
            exchanges.BroadcastExchange(self.spec.num_items),
        ),
    )

  def global_parameters(self, server_state) -> collections.OrderedDict:
    weights = self.process.get_model_weights(server_state)
    return collections.OrderedDict(
        item_embedding=np.asarray(weights.trainable[0])
    )

  def _put_fine_tuned_states(
      self, store, examples, item_embedding, user_embeddings
  ):
    """Stores every user's p_u and its fine-tuned item rows."""
    row_offsets, ids, rows = reconstruction.fine_tune_item_rows(
        item_embedding,
        examples.offsets,
        examples.items,
        examples.labels,
        user_embeddings,
        learning_rate=self.training.item_learning_rate,
        batch_size=self.training.batch_size,
    )
    store.put(
        np.arange(store.num_users),
        [
            collections.OrderedDict(
                local_parameters=collections.OrderedDict(
                    user_embedding=user_embeddings[user]
                ),
                personal_item_ids=ids[row_offsets[user] : row_offsets[user + 1]],
                personal_item_rows=rows[
                    row_offsets[user] : row_offsets[user + 1]
                ],
            )
            for user in range(store.num_users)
        ],
    )

  def run_round(self, server_state, store, round_input, *,
                users_per_client: int = 1,
                cohort_size: Optional[int] = None) -> method.RoundResult:
    """One round of `process.next`; afterwards the store holds every user's
    reconstructed embedding for evaluation.

    TFF's FedRecon takes one dataset per client, so `users_per_client` is
    ignored: every user is its own TFF client.
    """
    del users_per_client, cohort_size
    examples = round_input.examples
    datasets = [
        tf.data.Dataset.from_tensor_slices(
            collections.OrderedDict(x=data['items'], y=data['labels'])
        ).batch(self.training.batch_size)
        for data in round_input.user_data
    ]
    output = self.process.next(server_state, datasets)
    item_embedding = self.global_parameters(output.state)['item_embedding']
    user_embeddings = reconstruction.reconstruct_user_embeddings(
        item_embedding,
        examples.offsets,
        examples.items,
        examples.labels,
        self.initial_parameters['user_embedding'],
        learning_rate=self.training.learning_rate,
        batch_size=self.training.batch_size,
    )
    if self.training.dual_personalization:
      self._put_fine_tuned_states(
          store, examples, item_embedding, user_embeddings
      )
    else:
      store.put_local_parameters(
          np.arange(store.num_users),
          collections.OrderedDict(user_embedding=user_embeddings),
      )
    train_metrics = output.metrics['client_work']['train']
    # Every client downloads q and uploads its update of q, whole.
    sent = float(len(round_input.users) * exchanges.parameter_bytes(
        self.initial_parameters, ['item_embedding']
    ))
    return method.RoundResult(
        server_state=output.state,
        metrics={
            'train_loss': float(train_metrics['loss']),
            **{key: sent for key in exchanges.RoundBytes._fields},
        },
    )

  def config_summary(self) -> dict:
    return {'training': dataclasses.asdict(self.training),
            'embedding_dim': self.spec.embedding_dim}


def build_fedrecon(
    *,
    data: method.RunData,
    seed: int = 0,
    embedding_dim: int = 32,
    hidden_units: tuple[int, ...] = (),
    training: client_training.ClientTrainingConfig = (
        client_training.ClientTrainingConfig(dual_personalization=False)),
    model_aggregator: Optional[
        tff.aggregators.UnweightedAggregationFactory] = None,
    item_aggregator: Optional[
        tff.aggregators.UnweightedAggregationFactory] = None,
) -> ReconstructionMethod:
  """Builds FedRecon on `tff.learning.algorithms.build_fed_recon`.

  `training.learning_rate` is the reconstruction step of p_u and
  `training.item_learning_rate` the client step of q; one reconstruction
  epoch and one training epoch per round over all of a client's examples.
  `item_aggregator` (default `tff.aggregators.UnweightedMeanFactory()`)
  averages the clients' updates of q; FedRecon has no other global
  parameters, so `model_aggregator` must stay None.
  """
  if hidden_units:
    raise ValueError('FedRecon is tested with MF here; drop --hidden_units.')
  if model_aggregator is not None:
    raise ValueError('FedRecon aggregates only the item embedding.')
  if training.local_epochs != 1:
    raise ValueError('fedrecon runs one local epoch per round.')
  if training.user_learning_rate is not None:
    raise ValueError('FedRecon reconstructs p_u at --learning_rate; drop '
                     '--user_learning_rate.')
  num_items = data.num_items
  training = training.for_items(num_items)
  spec = models.RecommenderSpec('matrix_factorization', num_items, embedding_dim)
  params = models.initial_parameters(spec, seed)
  input_spec = collections.OrderedDict(
      x=tf.TensorSpec([None], tf.int32), y=tf.TensorSpec([None], tf.float32)
  )

  def model_fn():
    keras_model, item_layer, user_layer = _keras_model(params)
    return tff.learning.models.ReconstructionModel.from_keras_model_and_layers(
        keras_model,
        global_layers=[item_layer],
        local_layers=[user_layer],
        input_spec=input_spec,
    )

  process = tff.learning.algorithms.build_fed_recon(
      model_fn,
      loss_fn=lambda: tf.keras.losses.BinaryCrossentropy(from_logits=True),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(
          training.item_learning_rate
      ),
      reconstruction_optimizer_fn=tff.learning.optimizers.build_sgdm(
          training.learning_rate
      ),
      dataset_split_fn=(
          tff.learning.models.ReconstructionModel.build_dataset_split_fn(
              recon_epochs=1, post_recon_epochs=1
          )
      ),
      client_weighting=tff.learning.ClientWeighting.UNIFORM,
      model_aggregator_factory=(
          item_aggregator or tff.aggregators.UnweightedMeanFactory()
      ),
  )
  return ReconstructionMethod(
      spec=spec,
      initial_parameters=params,
      process=process,
      training=training,
      num_users=data.num_users,
  )
