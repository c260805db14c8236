"""End-to-end tests: the real training program on synthetic data.

Where the process itself is under test (the entry point, a killed run or
worker, a resume after a kill, the workers a run leaves behind), a run is
`python -m tff_fedrec.programs.train` in a subprocess, exactly as a user
starts it. The other runs call `training_program.main` in the test process
(`_train`), which saves a TensorFlow import (about 10 s) each; they still
start, use and stop a real TFF worker process.
"""

import csv
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from tff_fedrec import device_tiers
from tff_fedrec.algorithms import registry
from tff_fedrec.algorithms.fedras import compression
from tff_fedrec.programs import program_test_utils
from tff_fedrec.programs import training_program
from tff_fedrec.tasks import datasets
from tff_fedrec.tasks import leave_one_out
from tff_fedrec.tasks import split_cache

_SMALL_RUN = [
    '--dataset=synthetic',
    '--synthetic_users=60',
    '--synthetic_items=600',
    '--embedding_dim=8',
    '--item_learning_rate=50',
]


def _run_program(args, *, tag=None, timeout=300):
  env = dict(os.environ)
  env['TFF_FEDREC_TEST_TAG'] = tag or uuid.uuid4().hex
  return subprocess.run(
      [sys.executable, '-m', 'tff_fedrec.programs.train', *args],
      env=env, capture_output=True, text=True, timeout=timeout,
  )


def _train(args):
  """Runs the training program in-process; returns its stdout.

  `program_test_utils` asserts that the run stopped the TFF worker it
  started.
  """
  return program_test_utils.run_main('train', training_program.main, args)


def _processes_with_tag(tag):
  """PIDs of live processes whose environment carries `tag`."""
  found = []
  for pid in os.listdir('/proc'):
    if not pid.isdigit():
      continue
    try:
      with open(f'/proc/{pid}/environ', 'rb') as f:
        if f'TFF_FEDREC_TEST_TAG={tag}'.encode() in f.read():
          found.append(int(pid))
    except OSError:
      continue
  return found


def _read_metrics(root_dir):
  with open(os.path.join(root_dir, 'metrics.csv')) as f:
    return list(csv.DictReader(f))


@pytest.mark.parametrize(
    'method_flags',
    [
        ['--method=pfedrec'],
        ['--method=pfedrec', '--hidden_units=8', '--ldp_noise_scale=0.1'],
        ['--method=fedmf', '--dual_personalization',
         '--negative_pool=outside_training'],
        ['--method=fedncf'],
        ['--method=fedncf', '--dual_personalization', '--client_fraction=0.5'],
        ['--method=fedrecon', '--dual_personalization'],
    ],
    ids=lambda flags: ' '.join(f.lstrip('-') for f in flags),
)
def test_two_rounds_of_each_method_write_results_and_stop_their_worker(
    tmp_path, method_flags
):
  root_dir = str(tmp_path / 'run')
  stdout = _train(
      [*method_flags, *_SMALL_RUN, '--rounds=2', f'--root_dir={root_dir}'],
  )
  with open(os.path.join(root_dir, 'summary.json')) as f:
    summary = json.load(f)
  assert summary['method'] == method_flags[0].split('=')[1]
  assert summary['dataset'] == 'synthetic'
  assert summary['rounds_completed'] == 2
  assert summary['best_round'] in (1, 2)
  assert summary['negative_pool'] == (
      'outside_training' if '--negative_pool=outside_training' in method_flags
      else 'never_interacted')
  for key in ('hr@10', 'ndcg@10'):
    assert 0.0 <= summary['test'][key] <= 1.0
  assert summary['test']['ndcg@10'] <= summary['test']['hr@10']
  assert summary['seconds_per_round'] > 0
  assert summary['peak_rss_mb'] > 0
  _assert_peak_rss_kept_for_resumes(root_dir, summary)
  uploaded = summary['bytes_per_round']['upload']
  downloaded = summary['bytes_per_round']['download']
  if method_flags[0] == '--method=fedrecon' or any(
      f.startswith('--ldp_noise_scale') for f in method_flags
  ):
    # LDP and FedRecon upload the whole item table, the size of the download.
    assert uploaded == downloaded
  else:
    # Row-sparse uploads: only the rows each client touched.
    assert 0 < uploaded < downloaded
  rows = _read_metrics(root_dir)
  assert [int(r['round']) for r in rows] == [0, 1]
  assert 'test HR@10 / NDCG@10 at best round' in stdout


def test_device_tiers_replace_the_data_size_tiers_of_the_results(tmp_path):
  # RF²'s Algorithm 1 on the run's training items, seeded by --seed: the
  # users the results count per tier are the mapping's.
  root_dir = str(tmp_path / 'run')
  stdout = _train(['--method=pfedrec', *_SMALL_RUN, '--rounds=2', '--seed=3',
                   '--device_tiers=dirichlet:0.05', f'--root_dir={root_dir}'])
  with open(os.path.join(root_dir, 'summary.json')) as f:
    summary = json.load(f)
  data = datasets.load_leave_one_out(datasets.DataConfig(
      dataset='synthetic', synthetic_users=60, synthetic_items=600, seed=3))
  expected = np.bincount(device_tiers.dirichlet(
      data.train_offsets, data.train_items, 0.05, seed=3), minlength=3)
  users = {name: value['users']
           for name, value in summary['test']['per_tier'].items()}
  assert users == {name: n for name, n in zip(('low', 'mid', 'high'),
                                              expected.tolist()) if n}
  assert summary['config']['tiers'] == 'device tiers dirichlet:0.05'
  assert f'low ({expected[0]} users)' in stdout


def _assert_peak_rss_kept_for_resumes(root_dir, summary):
  # A resumed run reports the largest peak of its processes, from this file.
  with open(os.path.join(root_dir, 'peak_rss_mb.txt')) as f:
    assert float(f.read()) == pytest.approx(summary['peak_rss_mb'], abs=0.1)


_RESUME_ARGS = ['--method=pfedrec', *_SMALL_RUN, '--rounds=4']


# pytest-xdist (make test) keeps the tests that share a module fixture on
# one worker, so the fixture's run is trained once.
_SHARES_UNINTERRUPTED_RUN = pytest.mark.xdist_group('uninterrupted_run')


@pytest.fixture(scope='module')
def uninterrupted_run(tmp_path_factory):
  """Root dir of a 4-round run that nothing interrupted.

  Started as a user starts it, so the binary's normal exit is checked too:
  it must leave no process behind.
  """
  root_dir = str(tmp_path_factory.mktemp('uninterrupted'))
  tag = uuid.uuid4().hex
  result = _run_program([*_RESUME_ARGS, f'--root_dir={root_dir}'], tag=tag)
  assert result.returncode == 0, result.stderr[-3000:]
  assert _processes_with_tag(tag) == []
  return root_dir


def _assert_same_results(reference_dir, resumed_dir):
  with open(os.path.join(reference_dir, 'summary.json')) as f:
    expected = json.load(f)
  with open(os.path.join(resumed_dir, 'summary.json')) as f:
    actual = json.load(f)
  assert actual['rounds_completed'] == 4
  assert actual['best_round'] == expected['best_round']
  program_test_utils.assert_figures_close(actual['test'], expected['test'])
  expected_rows = _read_metrics(reference_dir)
  actual_rows = _read_metrics(resumed_dir)
  assert [r['round'] for r in actual_rows] == ['0', '1', '2', '3']
  for want, got in zip(expected_rows, actual_rows):
    for key in ('train_loss', 'val_hr_at_10', 'test_ndcg_at_10'):
      assert float(got[key]) == pytest.approx(float(want[key]), abs=1e-6)


@_SHARES_UNINTERRUPTED_RUN
def test_one_tff_client_per_user_gives_the_results_of_groups(
    uninterrupted_run, tmp_path
):
  # The uninterrupted run simulates its 60 users in groups of 32.
  root_dir = str(tmp_path / 'one_per_client')
  _train(
      [*_RESUME_ARGS, '--users_per_tff_client=1', f'--root_dir={root_dir}'],
  )
  _assert_same_results(uninterrupted_run, root_dir)


def _start_and_wait_for_checkpoint(args, root_dir, tag, version=2):
  env = dict(os.environ, TFF_FEDREC_TEST_TAG=tag)
  process = subprocess.Popen(
      [sys.executable, '-m', 'tff_fedrec.programs.train', *args,
       f'--root_dir={root_dir}'],
      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
  )
  checkpoint = os.path.join(root_dir, 'checkpoints', f'program_state_{version}')
  deadline = time.monotonic() + 240
  while not os.path.isdir(checkpoint) and process.poll() is None:
    assert time.monotonic() < deadline, f'no checkpoint {version}'
    time.sleep(0.05)
  return process


def _kill_and_wait_for_its_worker(process, tag):
  """SIGKILLs a training process started with `tag`; returns once its TFF
  worker is gone too. The kernel ends the worker with its parent
  (PR_SET_PDEATHSIG); its exit (freeing its memory) may take a moment on a
  busy machine."""
  process.send_signal(signal.SIGKILL)
  process.communicate()
  deadline = time.monotonic() + 30
  while _processes_with_tag(tag):
    assert time.monotonic() < deadline, 'the TFF worker outlived its run'
    time.sleep(0.05)


def _worker_pid(tag):
  for pid in _processes_with_tag(tag):
    with open(f'/proc/{pid}/comm') as f:
      if f.read().strip() == 'worker_binary':
        return pid
  raise AssertionError('no TFF worker found')


@_SHARES_UNINTERRUPTED_RUN
def test_killed_worker_is_restarted_and_the_run_ends_as_if_uninterrupted(
    tmp_path, uninterrupted_run
):
  root_dir = str(tmp_path / 'restarted')
  tag = uuid.uuid4().hex
  process = _start_and_wait_for_checkpoint(
      [*_RESUME_ARGS, '--max_worker_restarts=1'], root_dir, tag
  )
  os.kill(_worker_pid(tag), signal.SIGKILL)
  stdout, stderr = process.communicate(timeout=300)
  assert process.returncode == 0, stderr[-3000:]
  assert 'Restarting it and resuming from the last checkpoint' in stdout
  assert 'Resumed from checkpoint' in stdout
  _assert_same_results(uninterrupted_run, root_dir)
  assert _processes_with_tag(tag) == []


@_SHARES_UNINTERRUPTED_RUN
def test_killed_worker_without_restarts_fails_clearly_and_resumes_later(
    tmp_path, uninterrupted_run
):
  root_dir = str(tmp_path / 'failed')
  tag = uuid.uuid4().hex
  process = _start_and_wait_for_checkpoint(
      [*_RESUME_ARGS, '--max_worker_restarts=0'], root_dir, tag
  )
  os.kill(_worker_pid(tag), signal.SIGKILL)
  _, stderr = process.communicate(timeout=300)
  assert process.returncode == 3
  assert 'TFF worker' in stderr and 'run the same command again' in stderr
  assert 'Traceback' not in stderr
  assert _processes_with_tag(tag) == []
  _train([*_RESUME_ARGS, f'--root_dir={root_dir}'])
  _assert_same_results(uninterrupted_run, root_dir)


@_SHARES_UNINTERRUPTED_RUN
def test_killed_run_resumes_to_the_same_result_as_an_uninterrupted_run(
    tmp_path, uninterrupted_run
):
  # Killed and resumed in cohorts of one TFF client (32 users; the round's
  # 60 users make two): the same results as the uninterrupted run, which
  # trains its round as one computation.
  in_cohorts = [*_RESUME_ARGS, '--cohort_size=32']
  resumed_dir = str(tmp_path / 'killed')
  tag = uuid.uuid4().hex
  process = _start_and_wait_for_checkpoint(in_cohorts, resumed_dir, tag)
  _kill_and_wait_for_its_worker(process, tag)
  assert not os.path.exists(os.path.join(resumed_dir, 'summary.json'))

  resumed = _train([*in_cohorts, f'--root_dir={resumed_dir}'])
  assert 'Resumed from checkpoint' in resumed
  _assert_same_results(uninterrupted_run, resumed_dir)


@_SHARES_UNINTERRUPTED_RUN
def test_a_run_on_disk_killed_at_random_moments_ends_as_if_uninterrupted(
    tmp_path, uninterrupted_run
):
  # The client states in an SQLite database (--client_store=disk), whose
  # commit follows each checkpoint's files: kills at random moments after
  # a first checkpoint, then a resume, give the uninterrupted run's
  # results (which kept its states in memory).
  on_disk = [*_RESUME_ARGS, '--client_store=disk', '--cohort_size=32',
             '--checkpoint_every=1']
  root_dir = str(tmp_path / 'on_disk')
  rng = np.random.default_rng(7)
  for version in (1, 2):
    tag = uuid.uuid4().hex
    process = _start_and_wait_for_checkpoint(on_disk, root_dir, tag,
                                             version=version)
    time.sleep(float(rng.uniform(0.0, 1.0)))
    _kill_and_wait_for_its_worker(process, tag)
  resumed = _train([*on_disk, f'--root_dir={root_dir}'])
  assert 'Resumed from checkpoint' in resumed
  _assert_same_results(uninterrupted_run, root_dir)
  assert os.path.isfile(os.path.join(root_dir, 'checkpoints',
                                     'client_states.sqlite'))


def test_a_large_population_run_on_disk_has_the_figures_of_one_in_memory(
    tmp_path, monkeypatch
):
  # What a million users switch on, at 60: the split cached and then
  # memory-mapped (read-only), draws of the round's users only, and the
  # client state on disk. The second run reads the split the first cached
  # and keeps its states on disk; its figures are the first's.
  monkeypatch.setattr(split_cache, 'CACHED_FROM_USERS', 60)
  monkeypatch.setattr(leave_one_out, 'ROUND_USERS_ONLY_FROM', 60)
  args = ['--method=pfedrec', *_SMALL_RUN, '--rounds=3',
          '--clients_per_round=20', f'--cache_dir={tmp_path / "cache"}']
  in_memory, on_disk = str(tmp_path / 'memory'), str(tmp_path / 'disk')
  _train([*args, '--client_store=memory', f'--root_dir={in_memory}'])
  assert len(os.listdir(tmp_path / 'cache' / 'splits')) == 1
  _train([*args, '--client_store=disk', f'--root_dir={on_disk}'])
  with open(os.path.join(in_memory, 'summary.json')) as f:
    expected = json.load(f)
  with open(os.path.join(on_disk, 'summary.json')) as f:
    actual = json.load(f)
  assert actual['test'] == expected['test']
  assert actual['client_state_bytes_per_user'] == pytest.approx(
      expected['client_state_bytes_per_user'])
  for want, got in zip(_read_metrics(in_memory), _read_metrics(on_disk),
                       strict=True):
    assert got['train_loss'] == want['train_loss']


@pytest.mark.parametrize(
    'args, message',
    [
        (['--method=nosuch', '--dataset=synthetic'], 'nosuch'),
        (['--method=pfedrec'], '--dataset'),
    ],
)
def test_bad_flags_fail_with_a_message_naming_the_problem(
    tmp_path, args, message
):
  # Flag checks that come after parsing are tested through main() in
  # programs/training_program_test.py; these two go through the binary.
  result = _run_program([*args, f'--root_dir={tmp_path / "run"}'])
  assert result.returncode != 0
  assert message in result.stderr
  assert 'Traceback' not in result.stderr


def test_fedras_bandwidths_per_tier_follow_the_tier_ratio(tmp_path):
  root_dir = str(tmp_path / 'run')
  stdout = _train(
      ['--method=fedras', *_SMALL_RUN, '--rounds=2', '--client_fraction=0.5',
       '--tier_compression_rates=0.9,0.8,0.5', '--tier_ratio=5,3,2',
       '--alpha=0.5', f'--root_dir={root_dir}'],
  )
  with open(os.path.join(root_dir, 'summary.json')) as f:
    summary = json.load(f)
  # 60 users split 5:3:2 by training interactions, fewest first.
  assert summary['config']['exchange']['users_per_tier_rate'] == {
      '0.9': 30, '0.8': 18, '0.5': 12
  }
  # Each tier's e_u is the action count of its rate on the run's items.
  actions = lambda rate: compression.pick_parameter(
      'fedras', summary['num_items'], 8, rate
  )
  assert actions(0.9) < actions(0.8) < actions(0.5)
  assert (f'rate 0.9 -> {actions(0.9)} rows (30 users), rate 0.8 -> '
          f'{actions(0.8)} rows (18 users), rate 0.5 -> {actions(0.5)} rows '
          '(12 users)') in stdout
  assert summary['rounds_completed'] == 2


@pytest.mark.parametrize('method_flags', [
    ['--method=fedras'],
    ['--method=fedras', '--model=ncf', '--compression_rate_range=0.7,0.8',
     '--alpha=0.5'],
    ['--method=topk'],
    ['--method=svd'],
    ['--method=colr'],
    ['--method=base_small_dim'],
], ids=lambda flags: ' '.join(f.lstrip('-') for f in flags))
def test_two_rounds_of_each_compressed_method_report_their_bytes(
    tmp_path, method_flags
):
  root_dir = str(tmp_path / 'run')
  stdout = _train(
      [*method_flags, *_SMALL_RUN, '--rounds=2', '--client_fraction=0.5',
       '--compression_rate=0.75', f'--root_dir={root_dir}'],
  )
  with open(os.path.join(root_dir, 'summary.json')) as f:
    summary = json.load(f)
  assert summary['rounds_completed'] == 2
  rate = summary['measured_compression_rate']
  # Something was saved each way, never more than everything.
  assert 0 < rate['uplink'] < 1 and 0 < rate['downlink'] < 1
  # Round 1's clients applied round 0's message: a rate of its own.
  assert 0 < rate['downlink_per_message'] < 1
  assert summary['bytes_per_round']['upload'] > 0
  assert 'measured compression' in stdout


_TIERED_RUN = [
    '--dataset=synthetic',
    '--synthetic_users=60',
    '--synthetic_items=200',
    '--clients_per_round=30',
    '--tier_widths=2,4,8',
    '--users_per_tff_client=8',
]


@pytest.mark.parametrize(
    'method, extra_flags',
    [(m, []) for m in sorted(registry.methods_taking('random_split'))]
    # Every option of the training rule at once: each reaches the process
    # (its math is tested on its own in hetefedrec/process_test).
    + [('hetefedrec', ['--model=lightgcn', '--update_rule=local_adam',
                       '--local_epochs=2', '--local_validation_fraction=0.1',
                       '--change_aggregation=mean', '--local_batch_size=16',
                       '--training_negatives=once'])],
    ids=lambda value: (
        ' '.join(f.lstrip('-') for f in value)
        if isinstance(value, list) else value
    ),
)
def test_two_rounds_of_each_tiered_method(tmp_path, method, extra_flags):
  root_dir = str(tmp_path / 'run')
  stdout = _train(
      [f'--method={method}', *_TIERED_RUN, *extra_flags, '--rounds=2',
       '--eval_every=1', f'--root_dir={root_dir}'],
  )
  with open(os.path.join(root_dir, 'summary.json')) as f:
    summary = json.load(f)
  assert summary['method'] == method
  assert summary['rounds_completed'] == 2
  options = dict(f.lstrip('-').partition('=')[::2] for f in extra_flags)
  # The options reach the process and the loop (flags named as the
  # fields of HeteroConfig and HeteroLoopConfig).
  config = {**summary['config']['loop'], **summary['config']['method']}
  for name, value in options.items():
    if name in config:
      assert str(config[name]) == value
  test = summary['test']
  assert set(test['per_tier']) == {'small', 'medium', 'large'}
  # 5:3:2 of 60 users.
  assert [test['per_tier'][t]['users'] for t in ('small', 'medium', 'large')
          ] == [30, 18, 12]
  for scores in [test, *test['per_tier'].values()]:
    assert 0.0 <= scores['recall@20'] <= 1.0
    assert 0.0 <= scores['ndcg@20'] <= 1.0
  # Every evaluation, per tier too (Fig. 6 along the run); the last is
  # the reported one.
  history = summary['test_history']
  assert [h['round'] for h in history] == [1, 2]
  assert history[-1] == {'round': 2, **test}
  assert set(history[0]['per_tier']) == {'small', 'medium', 'large'}
  sent = summary['bytes_per_client']
  if method == 'all_small':
    assert sent['small'] == sent['medium'] == sent['large']
  elif method.startswith('all_large'):
    assert sent['small']['download'] == sent['large']['download']
  elif method == 'standalone':
    assert all(s == {'download': 0, 'upload': 0} for s in sent.values())
  else:
    # Table III: a small client never moves more than a small model.
    assert (sent['small']['download'] < sent['medium']['download']
            < sent['large']['download'])
  if method == 'all_large_exclusive':
    assert sent['small']['upload'] == 0
  assert [int(r['round']) for r in _read_metrics(root_dir)] == [0, 1]
  assert 'Recall@20' in stdout
  # The local epoch the clients kept: L unless a validation split chose
  # an earlier one; none under server Adam.
  epochs = int(options.get('local_epochs', 1))
  kept = summary['mean_kept_epoch']
  if method == 'standalone':
    assert kept is None  # Nothing like a kept epoch: no local epochs.
    return
  if options.get('update_rule') != 'local_adam':
    assert kept == 0
  elif 'local_validation_fraction' in options:
    assert 1 <= kept <= epochs
  else:
    assert kept == epochs
  # metrics.csv has each round's figure; the summary their mean.
  per_round = [float(r['mean_kept_epoch']) for r in _read_metrics(root_dir)]
  assert sum(per_round) / len(per_round) == pytest.approx(kept)


@pytest.mark.parametrize('method, extra_flags', [
    # Server Adam's moments and negatives drawn once: the same when resumed.
    ('hetefedrec', ['--training_negatives=once']),
    # Whole models as client state, saved every third round only.
    ('standalone', ['--checkpoint_every=3']),
])
def test_tiered_run_resumes_with_the_results_of_an_uninterrupted_one(
    tmp_path, method, extra_flags
):
  args = [f'--method={method}', *_TIERED_RUN, *extra_flags, '--eval_every=2']
  whole = str(tmp_path / 'whole')
  parts = str(tmp_path / 'parts')
  _train([*args, '--rounds=4', f'--root_dir={whole}'])
  _train([*args, '--rounds=2', f'--root_dir={parts}'])
  resumed = _train([*args, '--rounds=4', f'--root_dir={parts}'])
  assert 'Resumed from checkpoint' in resumed
  summaries = []
  for root in (whole, parts):
    with open(os.path.join(root, 'summary.json')) as f:
      summaries.append(json.load(f))
  assert summaries[1]['rounds_completed'] == 4
  _assert_peak_rss_kept_for_resumes(parts, summaries[1])
  for whole_scores, part_scores in [
      (summaries[0]['test'], summaries[1]['test']),
      *zip(summaries[0]['test']['per_tier'].values(),
           summaries[1]['test']['per_tier'].values()),
  ]:
    for key in ('recall@20', 'ndcg@20'):
      assert part_scores[key] == pytest.approx(whole_scores[key], abs=1e-6)
  losses = [[float(r['train_loss']) for r in _read_metrics(root)]
            for root in (whole, parts)]
  assert losses[1] == pytest.approx(losses[0], abs=1e-6)


def test_a_diverging_run_stops_before_it_saves_a_non_finite_state(tmp_path):
  # An Adam step of 1e30 leaves round 1's parameters finite but huge, so
  # round 2's logits overflow.
  root_dir = str(tmp_path / 'run')
  status, stderr = program_test_utils.exit_status_and_stderr(
      'train', training_program.main,
      ['--method=all_small', *_TIERED_RUN, '--rounds=4', '--eval_every=4',
       '--learning_rate=1e30', f'--root_dir={root_dir}'],
  )
  assert status == 2
  assert 'training diverged at round 2: the training loss is' in stderr
  assert 'the last checkpoint holds round 1' in stderr
  assert sorted(os.listdir(os.path.join(root_dir, 'checkpoints'))) == [
      'program_state_1'
  ]
  assert not os.path.exists(os.path.join(root_dir, 'summary.json'))
