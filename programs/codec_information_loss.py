"""FedRAS Table 3: the information loss of each compression strategy.

`measure` trains FedMF without compression (10% of the users per round,
SGD, its own TFF process: `fedmf.build_fedmf`) and, every round, passes the
same client updates (observed between the process's client and server
step) and the same server aggregate through each strategy's codecs,
measuring the client-side and server-side loss of
`fedras.information_loss`:

  FedRAS  clustered actions up (participation mean, Sec. 4.4) and
          cluster-and-split down (Sec. 4.3);
  CE      the same codecs on the trained embeddings and on the table
          (FedRAS-E);
  Top-K, SVD, CoLR  the baselines' upload codecs (FedAvg) and downlinks.

Every strategy sees the same gradients, so the figures compare the codecs
and not five training trajectories. The binary is `information_loss`.
"""

import collections
import dataclasses
import time

import numpy as np
import tensorflow as tf

from tff_fedrec.algorithms import fedmf as fedmf_lib
from tff_fedrec.algorithms import method
from tff_fedrec.algorithms.fedras import bandwidths as fedras_bandwidths
from tff_fedrec.algorithms.fedras import compressed_exchange
from tff_fedrec.algorithms.fedras import compression
from tff_fedrec.algorithms.fedras import downlink
from tff_fedrec.algorithms.fedras import downlink_codecs
from tff_fedrec.algorithms.fedras import exchange as fedras_exchange
from tff_fedrec.algorithms.fedras import information_loss
from tff_fedrec.algorithms.fedras import methods as fedras
from tff_fedrec.algorithms.fedras import row_codecs
from tff_fedrec.tasks import leave_one_out

STRATEGIES = ('CE', 'SVD', 'CoLR', 'Top-K', 'FedRAS')
_UPLOAD_NORMALIZATION = {
    'CE': 'participation', 'FedRAS': 'participation',
    'SVD': 'clients', 'CoLR': 'clients', 'Top-K': 'clients',
}


def strategy_codecs(num_items: int, dim: int, rate: float, alpha: float):
  """{strategy: (upload codec, downlink codec, e_u)} at compression `rate`:
  the codecs the methods of `algorithms.fedras` use."""
  bandwidths = fedras_bandwidths.ClientBandwidths(num_items, dim, rate)
  groups = bandwidths.expected_groups

  def clustered():
    return (
        row_codecs.ClusteredActions(),
        downlink_codecs.ClusteredActionsDownlink(
            num_items, dim, expected_groups=groups, alpha=alpha
        ),
    )

  codecs = {'CE': clustered(), 'FedRAS': clustered()}
  for name, scheme in (('SVD', 'svd'), ('CoLR', 'colr'), ('Top-K', 'top_k')):
    codecs[name] = fedras_exchange.baseline_codecs(scheme, num_items, dim, rate)
  return {name: (*pair, groups) for name, pair in codecs.items()}


def _group_rows(upload, data, table):
  """(deltas, embeddings), float32 [U, T, d]: each user's trained rows of
  its compact table (`data['row_ids']`, `num_rows`) as FedMF's row-sparse
  upload carries them (each user's delta over U, its real rows in order),
  and the rows themselves (`table`, the round's download, plus the
  delta)."""
  ids = data['row_ids']
  real = np.arange(ids.shape[1])[None, :] < data['num_rows'][:, None]
  deltas = np.zeros([*ids.shape, table.shape[1]], np.float32)
  deltas[real] = np.asarray(upload['row_values']) * ids.shape[0]
  return deltas, table[ids] + deltas


def measure(data, *, rounds, rate, alpha, client_fraction, dim,
            learning_rate, item_learning_rate, users_per_group, seed,
            log=print) -> dict:
  """{strategy: {'client_mse', 'client_relative', 'server_mse',
  'server_relative', 'client_seconds', 'server_seconds'}}: the losses
  averaged over `rounds` rounds of uncompressed FedMF on leave-one-out
  `data`, and the seconds per round (after round 0, which traces) of every
  client's encode and decode and of the server's encode and one client's
  decode. FedMF trains through its own TFF process (`fedmf.build_fedmf`,
  FedRAS Sec. 5.1's local training), so this needs a TFF execution
  context; its uploads are observed between its client and server step.
  """
  num_items = data.num_items
  fedmf = fedmf_lib.build_fedmf(
      data=method.RunData.of(data), seed=seed, embedding_dim=dim,
      training=dataclasses.replace(
          fedras.PAPER_TRAINING, learning_rate=learning_rate,
          item_learning_rate=item_learning_rate),
  )
  state, store = fedmf.process.initialize(), fedmf.initial_store()
  codecs = strategy_codecs(num_items, dim, rate, alpha)
  encoder_states = {name: c[1].initial_state() for name, c in codecs.items()}
  protocol = leave_one_out.LeaveOneOut(
      data, seed=seed,
      clients_per_round=max(1, int(data.num_users * client_fraction)),
  )
  # One function per strategy: a codec is a Python object, so sharing one
  # would retrace for each.
  decoders = {
      name: tf.function(information_loss.decoded_uploads,
                        reduce_retracing=True)
      for name in codecs
  }
  server_steps = {
      name: tf.function(information_loss.server_loss) for name in codecs
  }
  totals = {name: collections.defaultdict(float) for name in STRATEGIES}
  for round_num in range(rounds):
    started = time.time()
    round_input = protocol.round_input(round_num)
    table = np.asarray(state['global_parameters']['item_embedding'])
    observed = []
    state, _ = fedmf.run_exchange(
        fedmf.process, state, store, round_input,
        users_per_client=users_per_group, observe_uploads=observed.extend,
    )
    sums = {}  # strategy or ('raw', kind) -> (update_sum, participants)
    for _, group, upload in observed:
      deltas, embeddings = _group_rows(
          upload['update']['item_embedding'], group, table)
      rows = {'delta': tf.constant(deltas),
              'embedding': tf.constant(embeddings)}
      seeds = compressed_exchange.kmeans_seeds(group['seeds'])
      shared = downlink.round_seed(seed, round_num)
      sent = {('raw', kind): value for kind, value in rows.items()}
      for name, (upload_codec, _, groups) in codecs.items():
        clock = time.perf_counter()
        sent[name] = decoders[name](
            upload_codec, rows['embedding' if name == 'CE' else 'delta'],
            group['num_rows'],
            bandwidth=np.full(len(group['num_rows']), groups, np.int32),
            seeds=seeds, shared_seed=shared,
        )
        if round_num:  # Round 0 traces.
          totals[name]['client_seconds'] += time.perf_counter() - clock
      for key, value in sent.items():
        update_sum, participants = compression.scatter_rows(
            value, group['num_rows'], group['row_ids'], num_items
        )
        previous = sums.get(key, (0.0, 0.0))
        sums[key] = (previous[0] + update_sum, previous[1] + participants)
    for name, (_, downlink_codec, groups) in codecs.items():
      kind = 'embedding' if name == 'CE' else 'delta'
      normalization = _UPLOAD_NORMALIZATION[name]
      reference = information_loss.normalize(
          *sums[('raw', kind)], len(round_input.users), normalization
      )
      compressed = information_loss.normalize(
          *sums[name], len(round_input.users), normalization
      )
      client = information_loss.compression_loss(compressed, reference)
      if kind == 'embedding':
        trained = sums[('raw', kind)][1][:, tf.newaxis] > 0
        payload = tf.where(trained, reference, table)
      else:
        payload = reference
      clock = time.perf_counter()
      server, encoder_states[name] = server_steps[name](
          downlink_codec, payload, encoder_states[name],
          downlink.round_seed(seed, round_num), groups,
      )
      if round_num:
        totals[name]['server_seconds'] += time.perf_counter() - clock
      for side, loss in (('client', client), ('server', server)):
        for field in loss._fields:
          totals[name][f'{side}_{field}'] += float(getattr(loss, field))
    log(f'round {round_num + 1}/{rounds}: {time.time() - started:.1f}s')
  results = {}
  for name, total in totals.items():
    results[name] = {
        key: value / rounds for key, value in total.items()
        if not key.endswith('seconds')
    }
    for key in ('client_seconds', 'server_seconds'):
      # Round 0 traces, so one round gives no time.
      results[name][key] = (
          total[key] / (rounds - 1) if rounds > 1 else float('nan')
      )
  return results
