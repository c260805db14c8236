"""The Table 3 measurement on synthetic data, through the real codecs."""

import numpy as np
import pytest

from tff_fedrec.algorithms.fedras import bandwidths as fedras
from tff_fedrec.programs import codec_information_loss
from tff_fedrec.programs import execution
from tff_fedrec.tasks import datasets


@pytest.fixture(scope='module')
def losses():
  data = datasets.load_leave_one_out(
      datasets.DataConfig(
          dataset='synthetic', synthetic_users=40, synthetic_items=400,
          synthetic_mean_interactions=12.0, seed=0,
      ),
      num_eval_negatives=20,
  )
  # At 10% every user's e_u (C_e rows) is at least its distinct items
  # (checked below), so FedRAS's and CE's uploads go as they are.
  most_rows = 5 * np.diff(data.train_offsets).max()  # 4 negatives each
  assert most_rows <= fedras.ClientBandwidths(
      data.num_items, 8, 0.1
  ).expected_groups
  with execution.worker_execution_context():
    return codec_information_loss.measure(
        data, rounds=2, rate=0.1, alpha=0.2, client_fraction=0.5, dim=8,
        learning_rate=0.1, item_learning_rate=100.0, users_per_group=8,
        seed=0, log=lambda _: None,
    )


def test_every_strategy_is_measured_on_both_sides(losses):
  assert set(losses) == set(codec_information_loss.STRATEGIES)
  for name, loss in losses.items():
    for key in ('client_mse', 'server_mse', 'client_relative',
                'server_relative', 'client_seconds', 'server_seconds'):
      assert loss[key] >= 0.0, (name, key)


def test_uploads_within_bandwidth_lose_nothing(losses):
  # FedRAS and CE send the rows as they are; CoLR's budget buys rank d,
  # which its full-rank B reconstructs exactly.
  for name in ('FedRAS', 'CE', 'CoLR'):
    assert losses[name]['client_relative'] < 1e-10, name


def test_lossy_schemes_lose_something(losses):
  # Top-K's budget cannot buy all d entries of every row (index bytes);
  # the downlinks at 10% are lossy for every scheme.
  assert losses['Top-K']['client_relative'] > 1e-4
  for name in codec_information_loss.STRATEGIES:
    assert losses[name]['server_relative'] > 1e-6, name
