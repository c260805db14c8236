import asyncio
import collections

import numpy as np
import pytest

from tff_fedrec import csr
from tff_fedrec.programs import numpy_program_state


def _state(round_num, fill):
  return collections.OrderedDict(
      next_round=np.int64(round_num),
      server=collections.OrderedDict(
          tables=[np.full([3, 2], fill, np.float32),
                  np.full([3, 4], -fill, np.float32)],
          round_num=np.int32(round_num),
      ),
      history='{"rounds": [1, 2]}',
  )


def test_saves_and_loads_the_latest_version_exactly(tmp_path):
  manager = numpy_program_state.NumpyProgramStateManager(str(tmp_path))
  assert asyncio.run(manager.load_latest(_state(0, 0.0))) == (None, 0)
  for version in (1, 2, 3):
    asyncio.run(manager.save(_state(version, float(version)), version))
  # keep_total = 2: version 1 is gone.
  assert asyncio.run(manager.get_versions()) == [2, 3]
  state, version = asyncio.run(manager.load_latest(_state(0, 0.0)))
  assert version == 3
  assert int(state['next_round']) == 3
  np.testing.assert_array_equal(state['server']['tables'][1],
                                np.full([3, 4], -3.0))
  assert state['server']['round_num'].dtype == np.int32
  assert str(state['history']) == '{"rounds": [1, 2]}'


def test_a_leaf_in_pieces_is_written_whole_and_loads_as_read_only_maps(
    tmp_path):
  manager = numpy_program_state.NumpyProgramStateManager(str(tmp_path))
  rows = [np.full([2, 3], 1.0, np.float32), np.zeros([0, 3], np.float32),
          np.full([1, 3], 2.0, np.float32)]
  state = collections.OrderedDict(
      next_round=np.int64(4), rows=csr.ValuesInPieces(rows))
  asyncio.run(manager.save(state, 4))
  loaded, version = asyncio.run(manager.load_latest(state))
  assert version == 4
  np.testing.assert_array_equal(loaded['rows'], np.concatenate(rows))
  # Maps of the files: a reader copies what it keeps, nothing is written.
  assert isinstance(loaded['rows'], np.memmap)
  assert not loaded['rows'].flags.writeable


def test_a_killed_save_leaves_the_previous_version_loadable(tmp_path):
  manager = numpy_program_state.NumpyProgramStateManager(str(tmp_path))
  asyncio.run(manager.save(_state(1, 1.0), 1))
  # What a save killed mid-way leaves: a temporary directory, half written.
  partial = tmp_path / 'program_state_2_temporary'
  partial.mkdir()
  (partial / '0.npy').write_bytes(b'garbage')
  assert asyncio.run(manager.get_versions()) == [1]
  state, version = asyncio.run(manager.load_latest(_state(0, 0.0)))
  assert version == 1 and int(state['next_round']) == 1
  # The next save of that version replaces the leftover.
  asyncio.run(manager.save(_state(2, 2.0), 2))
  assert not partial.exists()
  assert asyncio.run(manager.get_versions()) == [1, 2]


def test_a_checkpoint_of_another_structure_is_refused_clearly(tmp_path):
  manager = numpy_program_state.NumpyProgramStateManager(str(tmp_path))
  asyncio.run(manager.save(_state(1, 1.0), 1))
  other = collections.OrderedDict(next_round=np.int64(0))
  with pytest.raises(numpy_program_state.UnreadableCheckpointError,
                     match='holds 5 arrays, but this program keeps 1'):
    asyncio.run(manager.load_latest(other))


@pytest.mark.parametrize('written, commit', [(1, '19023d5'), (2, '7e1d56f'),
                                             (3, '4e13096'), (4, 'cc6b66b'),
                                             (5, 'ce37e9b'), (8, None)])
def test_a_checkpoint_of_another_format_is_refused(tmp_path, written, commit):
  manager = numpy_program_state.NumpyProgramStateManager(str(tmp_path))
  asyncio.run(manager.save(_state(1, 1.0), 1))
  version_dir = tmp_path / 'program_state_1'
  assert (version_dir / 'format.json').read_text() == '{"format": 6}'
  # Format 1 wrote no format.json; each earlier format names the last
  # commit that can still resume it.
  if written == 1:
    (version_dir / 'format.json').unlink()
  else:
    (version_dir / 'format.json').write_text(f'{{"format": {written}}}')
  with pytest.raises(ValueError, match=f'format {written};') as error:
    asyncio.run(manager.load_latest(_state(0, 0.0)))
  if commit:
    assert f'git checkout {commit}' in str(error.value)
  assert 'new --root_dir' in str(error.value)


@pytest.mark.parametrize('damage', ['truncate', 'empty', 'remove'])
def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before(
    tmp_path, damage
):
  manager = numpy_program_state.NumpyProgramStateManager(str(tmp_path))
  asyncio.run(manager.save(_state(1, 1.0), 1))
  asyncio.run(manager.save(_state(2, 2.0), 2))
  damaged = tmp_path / 'program_state_2' / '1.npy'
  if damage == 'truncate':
    damaged.write_bytes(damaged.read_bytes()[:-7])
  elif damage == 'empty':
    damaged.write_bytes(b'')
  else:
    damaged.unlink()

  state, version = asyncio.run(manager.load_latest(_state(0, 0.0)))

  assert version == 1 and int(state['next_round']) == 1
  np.testing.assert_array_equal(state['server']['tables'][0],
                                np.full([3, 2], 1.0))
  assert len(manager.passed_over) == 1
  assert 'program_state_2' in manager.passed_over[0]


def test_no_readable_checkpoint_names_each_problem_and_the_way_out(tmp_path):
  manager = numpy_program_state.NumpyProgramStateManager(str(tmp_path))
  asyncio.run(manager.save(_state(1, 1.0), 1))
  (tmp_path / 'program_state_1' / '0.npy').write_bytes(b'')
  with pytest.raises(numpy_program_state.UnreadableCheckpointError) as error:
    asyncio.run(manager.load_latest(_state(0, 0.0)))
  message = str(error.value)
  assert 'program_state_1/0.npy cannot be read' in message
  assert f'Delete {tmp_path}' in message and 'new --root_dir' in message
