"""The training program's answers to bad input, through `main` in-process.

`tests/end_to_end_test.py` starts `python -m tff_fedrec.programs.train` for
a few of these to check the real entry point; the rest run here, where a
case costs milliseconds instead of a TensorFlow import. Each case parses
the flags as the binary does and calls `training_program.main`, which must
exit with status 2 and name the problem on stderr, before any training.
"""

import pytest

from tff_fedrec.algorithms import registry
from tff_fedrec.programs import program_test_utils
from tff_fedrec.programs import training_program


def _exit_status_and_stderr(args, tmp_path):
  return program_test_utils.exit_status_and_stderr(
      'train', training_program.main,
      [*args, f'--root_dir={tmp_path / "run"}', '--rounds=1'],
  )


@pytest.mark.parametrize(
    'args, message',
    [
        (['--method=pfedrec', '--data_path=/nonexistent/ratings.csv'],
         '/nonexistent/ratings.csv'),
        (['--method=pfedrec', '--dataset=synthetic', '--clients_per_round=5',
          '--client_fraction=0.5'], 'not both'),
        (['--method=pfedrec', '--dataset=synthetic',
          '--clients_per_round=100000'], '--clients_per_round must be in [1, 200]'),
        (['--method=pfedrec', '--dataset=synthetic',
          '--nodual_personalization'], 'fedmf'),
        (['--method=fedmf', '--dataset=synthetic', '--hidden_units=8'],
         'hidden_units'),
        (['--method=fedmf', '--dataset=synthetic', '--users_per_tff_client=0'],
         '--users_per_tff_client'),
        (['--method=fedmf', '--dataset=synthetic', '--cohort_size=0'],
         '--cohort_size must be at least 1'),
        (['--method=fedmf', '--dataset=synthetic', '--cohort_size=4294967296'],
         '--cohort_size'),
        (['--method=hetefedrec', '--dataset=synthetic',
          '--nolightgcn_neighbor_gradient'], '--model=lightgcn only'),
        (['--method=hetefedrec', '--dataset=synthetic', '--local_epochs=5'],
         '--local_epochs does not apply to --method=hetefedrec'),
        (['--method=hetefedrec', '--dataset=synthetic',
          '--update_rule=local_adam', '--user_optimizer=adam'],
         '--user_optimizer does not apply to --update_rule=local_adam'),
        (['--method=hetefedrec', '--dataset=synthetic',
          '--local_validation_fraction=0.1'],
         '--local_validation_fraction needs --update_rule=local_adam'),
        (['--method=all_small', '--dataset=synthetic',
          '--change_aggregation=mean'],
         '--change_aggregation needs --update_rule=local_adam'),
        (['--method=hetefedrec', '--dataset=synthetic',
          '--update_rule=local_adam', '--local_validation_fraction=1'],
         '--local_validation_fraction must be in [0, 1)'),
        (['--method=pfedrec', '--dataset=synthetic',
          '--change_aggregation=mean'],
         '--change_aggregation does not apply to --method=pfedrec'),
        (['--method=hetefedrec', '--dataset=synthetic',
          '--local_batch_size=64'],
         '--local_batch_size needs --update_rule=local_adam'),
        (['--method=hetefedrec', '--dataset=synthetic',
          '--update_rule=local_adam', '--local_batch_size=-2'],
         '--local_batch_size must be >= 0'),
        (['--method=pfedrec', '--dataset=synthetic',
          '--training_negatives=once'],
         '--training_negatives does not apply to --method=pfedrec: it sets the 80/20 random-split protocol'),
        (['--method=standalone', '--dataset=synthetic',
          '--update_rule=local_adam'],
         '--update_rule does not apply to --method=standalone'),
        (['--method=pfedrec', '--dataset=synthetic',
          '--update_rule=local_adam'],
         '--update_rule does not apply to --method=pfedrec: it sets HeteFedRec\'s training rule'),
        (['--method=fedras', '--dataset=synthetic', '--nodual_task'],
         '--dual_task does not apply to --method=fedras'),
        (['--method=all_small', '--dataset=synthetic', '--embedding_dim=16'],
         '--embedding_dim does not apply to --method=all_small'),
        (['--method=topk', '--dataset=synthetic',
          '--tier_compression_rates=0.9,0.8,0.5'], 'fedras only'),
        (['--method=fedras', '--dataset=synthetic',
          '--tier_compression_rates=0.9,0.8'], '--tier_compression_rates takes 3 comma-separated rates'),
        (['--method=fedras', '--dataset=synthetic',
          '--tier_compression_rates=0.9,0.8,0.5',
          '--compression_rate_range=0.5,0.9'], 'give one of them'),
        (['--method=fedras', '--dataset=synthetic', '--exchange=topk'],
         '--exchange does not apply to --method=fedras'),
        (['--method=pfedrec', '--dataset=synthetic', '--exchange=fedras',
          '--ldp_noise_scale=0.1'],
         '--ldp_noise_scale applies to --exchange=broadcast only'),
        (['--method=pfedrec', '--dataset=synthetic',
          '--compression_rate=0.5'],
         '--compression_rate needs a compressed exchange'),
        (['--method=fedmf', '--dataset=synthetic', '--exchange=svd',
          '--alpha=0.3'], '--alpha applies to fedras only'),
        (['--method=pfedrec', '--dataset=synthetic', '--ldp_noise_scale=-1'],
         '--ldp_noise_scale must be a finite number >= 0'),
        (['--method=fedncf', '--dataset=synthetic', '--hidden_units=abc'],
         '--hidden_units takes comma-separated positive integers'),
        (['--method=fedrecon', '--dataset=synthetic', '--exchange=fedras'],
         '--exchange does not apply to --method=fedrecon'),
        (['--method=pfedrec', '--dataset=synthetic', '--executor=remote'],
         '--workers=HOST:PORT'),
        (['--method=pfedrec', '--dataset=synthetic', '--executor=remote',
          '--workers=127.0.0.1'], 'not HOST:PORT'),
        (['--method=pfedrec', '--dataset=synthetic',
          '--workers=127.0.0.1:8000'], '--executor=remote'),
        (['--method=apfr_gkd', '--dataset=synthetic',
          '--client_start=own_model', '--student_start=buffer_average'],
         'Drop --student_start'),
        (['--method=pfedrec', '--dataset=synthetic',
          '--user_learning_rate=1'],
         '--user_learning_rate does not apply to --method=pfedrec'),
        (['--method=fedrap', '--dataset=synthetic', '--client_start=own_model'],
         '--client_start does not apply to --method=fedrap'),
        (['--method=fedncf', '--dataset=synthetic', '--user_learning_rate=0'],
         '--user_learning_rate must be a finite number above 0'),
        (['--method=pfedrec', '--dataset=synthetic',
          '--item_learning_rate=5', '--item_lr_eta=8'], 'give one of them'),
        (['--method=hetefedrec', '--dataset=synthetic',
          '--update_rule=local_adam', '--user_learning_rate=0.1'],
         '--user_learning_rate does not apply to --update_rule=local_adam'),
    ],
)
def test_bad_flags_exit_with_status_2_naming_the_problem(
    tmp_path, args, message
):
  status, stderr = _exit_status_and_stderr(args, tmp_path)
  assert status == 2
  assert message in stderr
  assert not (tmp_path / 'run').exists()


def test_a_user_with_too_few_interactions_names_the_file_and_the_flag(
    tmp_path
):
  path = tmp_path / 'ratings.csv'
  # Users a and b have 4 interactions, c only 2: leave-one-out needs 3.
  path.write_text(''.join(
      f'{user},{item},1,{t}\n'
      for t, (user, item) in enumerate(
          [('a', 1), ('a', 2), ('a', 3), ('a', 4), ('b', 1), ('b', 2),
           ('b', 3), ('b', 4), ('c', 1), ('c', 2)])))
  status, stderr = _exit_status_and_stderr(
      ['--method=pfedrec', f'--data_path={path}', '--num_eval_negatives=1'],
      tmp_path)
  assert status == 2
  assert str(path) in stderr and "user 'c' has 2" in stderr
  assert '--min_interactions=3' in stderr


def test_malformed_data_file_names_the_file_and_line(tmp_path):
  path = tmp_path / 'ratings.csv'
  lines = [f'u{u},i{i},5,{u * 100 + i}' for u in range(5) for i in range(5)]
  lines[7] = 'u1,i2,five,100'
  path.write_text('\n'.join(lines) + '\n')
  status, stderr = _exit_status_and_stderr(
      ['--method=pfedrec', f'--data_path={path}'], tmp_path
  )
  assert status == 2
  assert f'{path}:8:' in stderr


@pytest.mark.parametrize('method', sorted(registry.METHODS))
def test_help_of_every_method_lists_every_group_it_takes(method):
  # APFR-GKD's and FedRAP's groups were once missing from --help.
  entry = registry.METHODS[method]
  text = training_program.help_text(method)
  for name in {*training_program.COMMON_GROUPS, entry.protocol,
               *entry.flag_groups}:
    title = training_program.GROUPS[name].title
    assert f'{title} [{name}; ' in text, (method, name)
    for holder in training_program.GROUPS[name].holders:
      assert f'  --{holder.name}' in text, (method, holder.name)
