"""Methods whose client state takes each shape a store holds give the same
figures with it on disk (`--client_store=disk`) as in memory: FedRAP's
own tables (ragged rows merged round after round, per-user scales),
APFR-GKD's own models, Standalone's partitions of per-tier model sizes
(every user's own initial state written to the database), and RF²'s
stateless clients. PFedRec's is in `end_to_end_test`; every registry
entry is compared by `benchmarks/behaviour_snapshot.py` (docs/results/
scale.md)."""

import json
import os

import pytest

from tff_fedrec.programs import program_test_utils
from tff_fedrec.programs import training_program

_ITEM_RANKING = ['--dataset=synthetic', '--synthetic_users=40',
                 '--synthetic_items=300', '--num_eval_negatives=20',
                 '--users_per_tff_client=3', '--embedding_dim=8']
_CASES = {
    'fedrap': ['--method=fedrap', *_ITEM_RANKING, '--local_epochs=1',
               '--fedrap_batch_size=32', '--client_fraction=0.5'],
    'apfr_gkd_own_model': ['--method=apfr_gkd', *_ITEM_RANKING,
                           '--item_learning_rate=50', '--local_epochs=1',
                           '--client_start=own_model',
                           '--client_fraction=0.5'],
    'standalone': ['--method=standalone', '--dataset=synthetic',
                   '--synthetic_users=60', '--synthetic_items=200',
                   '--clients_per_round=30', '--tier_widths=2,4,8',
                   '--users_per_tff_client=3'],
    'rf2': ['--method=rf2', '--dataset=synthetic', '--synthetic_users=60',
            '--clients_per_round=20', '--users_per_tff_client=4',
            '--device_tiers=dirichlet:0.05'],
}


def _train(args, root_dir):
  program_test_utils.run_main(
      'train', training_program.main,
      [*args, '--rounds=2', '--seed=0', f'--root_dir={root_dir}'])
  with open(os.path.join(root_dir, 'summary.json')) as file:
    return json.load(file)


@pytest.mark.parametrize('case', sorted(_CASES))
def test_the_store_on_disk_gives_the_figures_of_the_store_in_memory(
    case, tmp_path):
  in_memory = _train([*_CASES[case], '--client_store=memory'],
                     str(tmp_path / 'memory'))
  on_disk = _train([*_CASES[case], '--client_store=disk'],
                   str(tmp_path / 'disk'))
  assert on_disk['test'] == in_memory['test']
  assert on_disk.get('validation') == in_memory.get('validation')
  if 'client_state_bytes_per_user' in in_memory:
    assert on_disk['client_state_bytes_per_user'] == pytest.approx(
        in_memory['client_state_bytes_per_user'])
  assert os.path.isfile(tmp_path / 'disk' / 'checkpoints' /
                        'client_states.sqlite')
