r"""FedRAS Table 3: the information loss of each compression strategy.

Trains FedMF without compression (10% of the users per round, SGD, the
training program's defaults; its own TFF process, on a TFF worker of this
program's) and passes the same client updates and the
same server aggregate through every strategy's codecs each round
(`codec_information_loss`). The paper's setting is MF on ML-1M at 93.75%:

  python -m tff_fedrec.programs.information_loss --dataset=ml-1m \
      --rounds=20
"""

from absl import app
from absl import flags

from tff_fedrec.algorithms.fedras import exchange as fedras_exchange
from tff_fedrec.programs import codec_information_loss
from tff_fedrec.programs import execution
from tff_fedrec.tasks import datasets

_DATASET = flags.DEFINE_enum(
    'dataset', 'ml-1m', list(datasets.NAMED_DATASETS), 'Data set.'
)
_ROUNDS = flags.DEFINE_integer('rounds', 20, 'Rounds to average over.')
_RATE = flags.DEFINE_float('compression_rate', 0.9375, 'CR of Sec. 5.1.')
_ALPHA = flags.DEFINE_float('alpha', fedras_exchange.DEFAULT_ALPHA, 'Sec. 4.3.')
_CLIENT_FRACTION = flags.DEFINE_float(
    'client_fraction', 0.1, 'Share of the users per round.'
)
_EMBEDDING_DIM = flags.DEFINE_integer('embedding_dim', 32, 'd.')
_LEARNING_RATE = flags.DEFINE_float('learning_rate', 0.1, 'SGD rate of p_u.')
_ITEM_LR_ETA = flags.DEFINE_float(
    'item_lr_eta', 80.0,
    'Item rate = learning_rate * N * eta, the training program\'s default.',
)
_USERS_PER_GROUP = flags.DEFINE_integer(
    'users_per_group', 32, 'Users trained and encoded together.'
)
_SEED = flags.DEFINE_integer('seed', 0, 'Seed.')

def main(argv):
  del argv
  data = datasets.load_leave_one_out(
      datasets.DataConfig(dataset=_DATASET.value, seed=_SEED.value)
  )
  with execution.worker_execution_context():
    result = codec_information_loss.measure(
        data,
        rounds=_ROUNDS.value,
        rate=_RATE.value,
        alpha=_ALPHA.value,
        client_fraction=_CLIENT_FRACTION.value,
        dim=_EMBEDDING_DIM.value,
        learning_rate=_LEARNING_RATE.value,
        item_learning_rate=(
            _LEARNING_RATE.value * data.num_items * _ITEM_LR_ETA.value
        ),
        users_per_group=_USERS_PER_GROUP.value,
        seed=_SEED.value,
    )
  print(f'\n{_DATASET.value}, MF, CR {_RATE.value}: mean over '
        f'{_ROUNDS.value} rounds (MSE over the rows sent; relative = '
        '||error||^2 / ||Q||^2)')
  print(f'{"strategy":<8} {"client MSE":>11} {"server MSE":>11} '
        f'{"total MSE":>11} {"client rel":>11} {"server rel":>11} '
        f'{"clients s":>10} {"server s":>9}')
  for name in codec_information_loss.STRATEGIES:
    r = result[name]
    print(f'{name:<8} {r["client_mse"]:>11.3e} {r["server_mse"]:>11.3e} '
          f'{r["client_mse"] + r["server_mse"]:>11.3e} '
          f'{r["client_relative"]:>11.3e} {r["server_relative"]:>11.3e} '
          f'{r["client_seconds"]:>10.3f} {r["server_seconds"]:>9.3f}')
  print('clients s: every client\'s encode and decode of the round, summed; '
        'server s: the server\'s encode and one client\'s decode.')


if __name__ == '__main__':
  app.run(main)
