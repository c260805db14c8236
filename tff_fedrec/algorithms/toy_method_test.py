"""A method added in a test only: the proof that a new paper plugs in.

`build_popularity_bias` is a whole method in about 60 lines: a global item
popularity logit b_i (server) plus a private user bias c_u (client), one
SGD step of BCE a round on each user's feature rows (here one categorical
feature, the item). It is composed from the shared roles (a broadcast, its
client work, a keyed mean, `ApplyDelta`), keeps c_u in the generic
client-state store, groups users with `user_groups`, scores a protocol's
`CandidateItems`, and runs through the registry and the training program
(checkpoints and a resume included) without a line of shared code
changed.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrec import client_state_store
from tff_fedrec.aggregators import keyed
from tff_fedrec.algorithms import method
from tff_fedrec.algorithms import registry
from tff_fedrec.programs import program_test_utils
from tff_fedrec.programs import training_program
from tff_fedrec.templates import composer
from tff_fedrec.templates import distributors
from tff_fedrec.templates import finalizers
from tff_fedrec.templates import roles
from tff_fedrec.templates import user_groups

_RATE = 1.0


# --- The toy method: what a new paper adds (its module and builder). ---
def _process(num_items):
  init = tff.tensorflow.computation(lambda: collections.OrderedDict(
      popularity=tf.zeros([num_items])))
  data_type = collections.OrderedDict(
      features=tff.TensorType(np.int32, [None, None, 1]),
      labels=tff.TensorType(np.float32, [None, None]),
      num_examples=tff.TensorType(np.int32, [None]))

  @tff.tensorflow.computation(
      distributors.Broadcast().received_type(init.type_signature.result),
      tff.TensorType(np.float32, [None]), data_type)
  def client_update(received, bias, data):
    popularity = received['global_parameters']['popularity']
    mask = tf.sequence_mask(data['num_examples'], tf.shape(data['labels'])[1],
                            tf.float32)
    with tf.GradientTape() as tape:
      tape.watch([popularity, bias])
      logits = tf.gather(popularity, data['features'][..., 0]) + bias[:, None]
      losses = tf.nn.sigmoid_cross_entropy_with_logits(data['labels'], logits)
      total = tf.reduce_sum(tf.reduce_sum(losses * mask, 1) / tf.maximum(
          tf.reduce_sum(mask, 1), 1.0))
    g_popularity, g_bias = tape.gradient(total, [popularity, bias])
    users = tf.cast(tf.size(bias), tf.float32)
    return bias - _RATE * g_bias, collections.OrderedDict(
        update=collections.OrderedDict(
            popularity=-_RATE * tf.convert_to_tensor(g_popularity) / users),
        weight=users, metrics=collections.OrderedDict(
            loss_sum=tf.reduce_sum(losses * mask),
            num_examples=tf.reduce_sum(mask)))

  work = roles.client_work(client_update)
  return composer.compose_client_state_process(
      initial_global_parameters=init, distributor=distributors.Broadcast(),
      client_work=work, finalizer=finalizers.ApplyDelta(),
      aggregator=keyed.KeyedFactory({'popularity': tff.aggregators.MeanFactory()
                                     }).create(work.upload_type.update,
                                               tff.TensorType(np.float32)))


class PopularityBias(method.Method):
  """b_i + c_u: a global popularity and a private user bias."""

  def __init__(self, data):
    self.num_users, self.process = data.num_users, _process(data.num_items)

  def initial_store(self):
    return client_state_store.ClientStateStore(self.num_users, np.float32(0))

  def run_round(self, server_state, store, round_input, *, users_per_client=1,
                cohort_size=None):
    rows = [d['items'][:, None] for d in round_input.user_data]
    state, metrics = user_groups.run_round(
        self.process, server_state, store, round_input.users,
        sizes=[len(r) for r in rows], users_per_group=users_per_client,
        cohort_size=cohort_size,
        make_group_data=lambda p: collections.OrderedDict(
            features=user_groups.pad_rows([rows[i] for i in p], np.int32),
            labels=user_groups.pad_rows(
                [round_input.user_data[i]['labels'] for i in p], np.float32),
            num_examples=np.array([len(rows[i]) for i in p], np.int32)))
    return method.RoundResult(state, {'train_loss': float(
        metrics['train_loss'])})

  def score(self, server_state, store, examples):
    popularity = np.asarray(server_state['global_parameters']['popularity'])
    items = (np.arange(popularity.size)[None] if examples.items is None
             else examples.items)
    bias = store.stacked_local_parameters(examples.users)
    return popularity[items] + np.asarray(bias)[:, None]


def build_popularity_bias(*, data, seed=0):
  del seed  # Nothing random.
  return PopularityBias(data)
# --- End of the toy method. ---


_ENTRY = registry.MethodEntry(
    'popularity_bias', f'{__name__}:build_popularity_bias',
    registry.LEAVE_ONE_OUT, (), 'a test of the library')
_RUN = ['--method=popularity_bias', '--dataset=synthetic',
        '--synthetic_users=30', '--synthetic_items=100',
        '--num_eval_negatives=20', '--users_per_tff_client=4']


def _train(root_dir, *args):
  return program_test_utils.run_main(
      'train', training_program.main,
      [*_RUN, f'--root_dir={root_dir}', *args])


def test_a_method_of_a_test_trains_resumes_and_reports_through_the_program(
    tmp_path, monkeypatch):
  monkeypatch.setattr(registry, 'METHODS', dict(registry.METHODS))
  registry.register(_ENTRY)
  with pytest.raises(ValueError, match='already registered'):
    registry.register(_ENTRY)
  whole, parts = tmp_path / 'whole', tmp_path / 'parts'

  stdout = _train(whole, '--rounds=3')
  _train(parts, '--rounds=2')
  _train(parts, '--rounds=3')  # Resumes from the checkpoint of round 2.

  summary = program_test_utils.read_summary(whole)
  assert summary['method'] == 'popularity_bias'
  assert summary['rounds_completed'] == 3
  assert 'test HR@10 / NDCG@10 at best round' in stdout
  # Every user scores the same popularity, shifted by its own bias: the
  # popularity learnt from the federation ranks far above chance (21
  # candidates: HR@10 10 / 21 at random).
  assert summary['test']['hr@10'] > 0.6
  assert set(summary['test']['per_tier']) == {'small', 'medium', 'large'}
  program_test_utils.assert_figures_close(
      program_test_utils.read_summary(parts)['test'], summary['test'])
  losses = [float(row['train_loss'])
            for row in program_test_utils.read_metrics(whole)]
  assert losses[-1] < losses[0]
