import threading

import pytest

from tff_fedrec.programs import round_inputs


class _Protocol:
  """Records which rounds were drawn, on which thread."""

  def __init__(self, fail_at=None):
    self.calls = []
    self.fail_at = fail_at

  def round_input(self, round_num):
    self.calls.append((round_num, threading.current_thread().name))
    if round_num == self.fail_at:
      raise ValueError(f'no data for round {round_num}')
    return {'round': round_num}


def test_each_round_gets_its_own_input_and_the_next_is_drawn_ahead():
  protocol = _Protocol()
  with round_inputs.Prefetched(protocol.round_input, rounds=4) as inputs:
    assert inputs.get(1) == {'round': 1}  # A resumed run starts at 1.
    # Round 2 is being drawn (or drawn) before anyone asks for it.
    inputs._pending[2].result()
    assert [r for r, _ in protocol.calls] == [1, 2]
    assert inputs.get(2) == {'round': 2}
    assert inputs.get(3) == {'round': 3}
  # Nothing past the last round; every draw on the one background thread.
  assert [r for r, _ in protocol.calls] == [1, 2, 3]
  threads = {name for _, name in protocol.calls}
  assert len(threads) == 1
  assert threads != {threading.current_thread().name}


def test_a_draw_that_fails_raises_in_the_loop_when_its_round_comes():
  protocol = _Protocol(fail_at=1)
  with round_inputs.Prefetched(protocol.round_input, rounds=3) as inputs:
    assert inputs.get(0) == {'round': 0}
    with pytest.raises(ValueError, match='no data for round 1'):
      inputs.get(1)


def test_asking_out_of_order_draws_the_asked_round():
  protocol = _Protocol()
  with round_inputs.Prefetched(protocol.round_input, rounds=9) as inputs:
    inputs.get(0)
    assert inputs.get(5) == {'round': 5}
