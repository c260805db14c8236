"""The audit program on synthetic data: its closing lines, both
protocols, and its refusals; and `train`'s floor lines and their cache."""

import json

import pytest

from tff_fedrec.programs import audit
from tff_fedrec.programs import program_test_utils
from tff_fedrec.programs import protocol_floors
from tff_fedrec.programs import training_program
from tff_fedrec.tasks import floors
from tff_fedrec.tasks import leave_one_out
from tff_fedrec.tasks import preprocessing
from tff_fedrec.tasks import synthetic

_DATA = ['--dataset=synthetic', '--synthetic_users=60',
         '--synthetic_items=120', '--num_eval_negatives=29', '--rounds=2']


def _closing_lines(stdout, metric):
  lines = stdout.strip().splitlines()
  floor_lines = [line for line in lines
                 if line.split(' ')[0] in ('memorizer', 'popularity',
                                           'chance')
                 and line.split(' ')[1] == metric]
  assert [line.split(' ')[0] for line in floor_lines] == [
      'memorizer', 'popularity', 'chance']
  return floor_lines, [line for line in lines if line.startswith('WARNING:')]


@pytest.mark.parametrize('protocol, metric, chance', [
    ('leave_one_out', 'HR@10', 'chance HR@10 0.3333'),  # 10 of 1 + 29.
    ('random_split', 'Recall@20', None),
])
def test_the_audit_ends_with_a_line_per_floor(protocol, metric, chance,
                                              tmp_path):
  stdout = program_test_utils.run_main(
      'audit', audit.main,
      [*_DATA, f'--protocol={protocol}', f'--cache_dir={tmp_path}'])
  floor_lines, warnings = _closing_lines(stdout, metric)
  assert stdout.strip().splitlines()[-3 - len(warnings):] == (
      floor_lines + warnings)
  if chance:
    assert floor_lines[2] == chance


@pytest.mark.parametrize('args, message', [
    (['--rounds=0'], '--rounds'),
    (['--tier_optimization=quant:4'], 'three numbers'),
])
def test_bad_flags_are_refused(args, message):
  program_test_utils.refused('audit', audit.main, [*_DATA, *args], message)


def test_train_prints_and_saves_the_floors_of_its_split(tmp_path):
  root = tmp_path / 'run'
  args = ['--method=fedmf', *_DATA, f'--root_dir={root}',
          f'--cache_dir={tmp_path / "cache"}']
  stdout = program_test_utils.run_main('train', training_program.main, args)
  saved = program_test_utils.read_summary(root)['floors']
  floor_lines, warnings = _closing_lines(stdout, 'HR@10')
  assert floor_lines + warnings == floors.lines(saved)
  assert stdout.strip().splitlines()[-1] == (warnings or floor_lines)[-1]
  assert saved['rounds'] == 2 and saved['metric'] == 'hr@10'
  # Computed once: the cache holds them, and a run of another method on
  # the same split reads them back.
  cached = list((tmp_path / 'cache' / 'floors').glob('*.json'))
  assert len(cached) == 1
  assert json.loads(cached[0].read_text()) == saved
  other = tmp_path / 'other'
  program_test_utils.run_main(
      'train', training_program.main,
      ['--method=pfedrec', *args[1:-2], f'--root_dir={other}',
       f'--cache_dir={tmp_path / "cache"}'])
  assert program_test_utils.read_summary(other)['floors'] == saved
  assert len(list((tmp_path / 'cache' / 'floors').glob('*.json'))) == 1


def test_an_unreadable_cache_entry_is_computed_again(tmp_path):
  data = preprocessing.leave_one_out_split(
      preprocessing.index_interactions(synthetic.generate_interactions(
          num_users=20, num_items=200, seed=1)),
      num_eval_negatives=9, seed=0)
  protocol = leave_one_out.LeaveOneOut(data, clients_per_round=20)
  first = protocol_floors.cached_floors(protocol, 2, {'a': 1}, tmp_path)
  [path] = (tmp_path / 'floors').glob('*.json')
  assert json.loads(path.read_text()) == first == floors.floors(protocol, 2)
  path.write_text('{not json')
  assert protocol_floors.cached_floors(protocol, 2, {'a': 1}, tmp_path) == (
      first)
  assert json.loads(path.read_text()) == first
  # Another key (rounds, flags) is another entry.
  protocol_floors.cached_floors(protocol, 3, {'a': 1}, tmp_path)
  assert len(list((tmp_path / 'floors').glob('*.json'))) == 2
