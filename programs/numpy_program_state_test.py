import asyncio
import collections
import os

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
