"""FedRAS (Lu et al., KDD 2025) and the compression baselines of its Sec. 5.1.

Every builder makes a `item_method.LocalItemMethod`: FedMF
(`model='mf'`) or FedNCF with a global MLP (`model='ncf'`, Sec. 5.1) whose
item table travels through an exchange of `fedras.exchange`:

  build_fedras          FedRAS (`ablation` 'E', 'F', 'T': Sec. 5.4.1).
  build_codec_baseline  the baselines Topk, SVD and CoLR ('top_k', 'svd',
                        'colr').
  build_base_small_dim  "Base": FedMF / FedNCF broadcasting the table at
                        the embedding width d' whose dense table meets the
                        rate, its bytes counted against width d.

They take the keyword arguments of every registry builder (data, seed,
embedding_dim, hidden_units, training) plus `model` and the exchange's
options. Evaluation scores with the server's Q and theta and each user's
p_u.

Example:
  >>> method = build_fedras(data=run_data, seed=0,
  ...     exchange=exchange.FedRASOptions(compression_rate=0.9375))
  >>> method.exchange.bandwidths.expected_groups  # ML-100K, d = 32
  92
"""

import dataclasses
from typing import Optional

from tff_fedrec import models
from tff_fedrec.algorithms import method
from tff_fedrec.algorithms.fedras import exchange as exchange_lib
from tff_fedrec.algorithms.local_items import client_training
from tff_fedrec.algorithms.local_items import item_method

# Sec. 5.1: SGD, batch size 256, 2 local epochs; 4 negatives per positive
# are the protocol's.
PAPER_TRAINING = client_training.ClientTrainingConfig(
    batch_size=256, local_epochs=2, dual_personalization=False
)
# Sec. 5.1: "three feedforward layers with 64, 32, and 16 dimensions".
NCF_HIDDEN_UNITS = (64, 32, 16)
MODELS = ('mf', 'ncf')


def model_spec(model: str, num_items: int, embedding_dim: int,
               hidden_units) -> models.RecommenderSpec:
  """FedMF, or FedNCF with a global MLP (`NCF_HIDDEN_UNITS` if none)."""
  if model not in MODELS:
    raise ValueError(f'model must be one of {MODELS}; got {model!r}.')
  if model == 'mf':
    if hidden_units:
      raise ValueError('MF has no score layers; drop hidden_units.')
    return models.RecommenderSpec(
        'matrix_factorization', num_items, embedding_dim
    )
  return models.RecommenderSpec(
      'neural_cf', num_items, embedding_dim,
      tuple(hidden_units) or NCF_HIDDEN_UNITS, personal_score_layers=False,
  )


def _check_training(training: client_training.ClientTrainingConfig):
  if training.dual_personalization:
    raise ValueError(
        'FedRAS and its baselines train without dual personalization '
        '(for both, use --method=pfedrec --exchange=fedras).'
    )


def build_fedras(
    *,
    data: method.RunData,
    seed: int = 0,
    embedding_dim: int = 32,
    hidden_units: tuple[int, ...] = (),
    training: client_training.ClientTrainingConfig = PAPER_TRAINING,
    model: str = 'mf',
    exchange: exchange_lib.FedRASOptions = exchange_lib.FedRASOptions(),
    ablation: Optional[str] = None,
    item_aggregator=None,
    model_aggregator=None,
    tier_optimization: str = 'none',
) -> item_method.LocalItemMethod:
  """FedRAS on FedMF (`model='mf'`) or FedNCF; `ablation` (None, 'E', 'F',
  'T') overrides the options' (the registry's fedras_e / _f / _t)."""
  _check_training(training)
  if ablation is not None:
    exchange = dataclasses.replace(exchange, ablation=ablation)
  return item_method.build_method(
      model_spec(model, data.num_items, embedding_dim, hidden_units),
      training, exchange, data=data, seed=seed,
      item_aggregator=item_aggregator, model_aggregator=model_aggregator,
      tier_optimization=tier_optimization,
  )


def build_codec_baseline(
    scheme: str,
    *,
    data: method.RunData,
    seed: int = 0,
    embedding_dim: int = 32,
    hidden_units: tuple[int, ...] = (),
    training: client_training.ClientTrainingConfig = PAPER_TRAINING,
    model: str = 'mf',
    exchange: Optional[exchange_lib.CodecBaselineOptions] = None,
    item_aggregator=None,
    model_aggregator=None,
    tier_optimization: str = 'none',
) -> item_method.LocalItemMethod:
  """Topk, SVD or CoLR of Sec. 5.1 (`exchange_lib.CodecBaselineOptions`);
  `exchange`'s scheme is replaced by `scheme`."""
  _check_training(training)
  exchange = dataclasses.replace(
      exchange or exchange_lib.CodecBaselineOptions(scheme), scheme=scheme
  )
  return item_method.build_method(
      model_spec(model, data.num_items, embedding_dim, hidden_units),
      training, exchange, data=data, seed=seed,
      item_aggregator=item_aggregator, model_aggregator=model_aggregator,
      tier_optimization=tier_optimization,
  )


def small_embedding_dim(embedding_dim: int, compression_rate: float) -> int:
  """d' in [1, d] whose dense table's CR = 1 - d'/d is closest to the rate
  (ties to the smaller), "Base" of Sec. 5.1.

  Example: d = 32 at 0.9375 gives 2; at 0.9063, 3; at 0.9688, 1.
  """
  return min(
      range(1, embedding_dim + 1),
      key=lambda width: abs(1.0 - width / embedding_dim - compression_rate),
  )


def build_base_small_dim(
    *,
    data: method.RunData,
    seed: int = 0,
    embedding_dim: int = 32,
    hidden_units: tuple[int, ...] = (),
    training: client_training.ClientTrainingConfig = PAPER_TRAINING,
    model: str = 'mf',
    compression_rate: float = 0.9375,
    item_aggregator=None,
    model_aggregator=None,
    tier_optimization: str = 'none',
) -> item_method.LocalItemMethod:
  """"Base" of Sec. 5.1: FedAvg on FedMF / FedNCF with every embedding of
  width `small_embedding_dim(embedding_dim, compression_rate)`; the NCF
  MLP keeps its hidden units. Bytes as
  `exchange_lib.NarrowBroadcastExchange` counts them against width d."""
  if training.dual_personalization:
    raise ValueError('Base is plain FedAvg: no dual personalization.')
  if not 0 <= compression_rate < 1:
    raise ValueError(
        f'compression_rate must be in [0, 1); got {compression_rate}.'
    )
  spec = model_spec(
      model, data.num_items,
      small_embedding_dim(embedding_dim, compression_rate), hidden_units,
  )
  return item_method.build_method(
      spec, training,
      exchange_lib.NarrowBroadcastOptions(embedding_dim),
      data=data, seed=seed, item_aggregator=item_aggregator,
      model_aggregator=model_aggregator,
      tier_optimization=tier_optimization,
  )
