import asyncio
import collections

import numpy as np
import pytest

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
  with pytest.raises(ValueError, match='different method'):
    asyncio.run(manager.load_latest(other))


def test_a_checkpoint_of_the_format_before_the_refactor_is_refused(tmp_path):
  manager = numpy_program_state.NumpyProgramStateManager(str(tmp_path))
  asyncio.run(manager.save(_state(1, 1.0), 1))
  version_dir = tmp_path / 'program_state_1'
  assert (version_dir / 'format.json').read_text() == '{"format": 2}'
  # Format 1 wrote no format.json: such a checkpoint names the commit
  # that can still resume it.
  (version_dir / 'format.json').unlink()
  with pytest.raises(ValueError, match='format 1') as error:
    asyncio.run(manager.load_latest(_state(0, 0.0)))
  assert '19023d5' in str(error.value)
  assert 'new --root_dir' in str(error.value)
