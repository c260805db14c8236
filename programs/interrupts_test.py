import gc
import signal
import sys
import weakref

import pytest

from tff_fedrec.programs import interrupts


class _Value:
  pass


def _interrupt_inside_a_finalizer():
  """A Ctrl-C whose handler runs inside a weakref finalizer (as in a TFF run,
  where remote values are disposed of from finalizers)."""
  value = _Value()
  weakref.finalize(value, signal.raise_signal, signal.SIGINT)
  del value
  gc.collect()


@pytest.fixture(autouse=True)
def python_sigint_handler():
  """Python's own SIGINT handler for each test, whatever the process
  inherited: a run started in the background from a script (as CI may be)
  ignores SIGINT, and so would every test here."""
  previous_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, previous_handler)


@pytest.fixture
def unraisables():
  """Records what Python would print as "Exception ignored in ...".

  Call it in the test body: pytest puts its own hook in place for the test's
  call phase.
  """
  recorded = []
  saved = []

  def record():
    saved.append(sys.unraisablehook)
    sys.unraisablehook = lambda unraisable: recorded.append(
        unraisable.exc_type
    )
    return recorded

  yield record
  if saved:
    sys.unraisablehook = saved[0]


def test_without_the_handler_a_finalizer_swallows_the_interrupt(unraisables):
  unraisables = unraisables()
  # The failure this module exists for: the interrupt is printed and lost.
  _interrupt_inside_a_finalizer()
  assert unraisables == [KeyboardInterrupt]


def test_an_interrupt_a_finalizer_swallowed_is_quiet_and_raised_later(
    unraisables,
):
  unraisables = unraisables()
  with pytest.raises(KeyboardInterrupt):
    with interrupts.handled():
      _interrupt_inside_a_finalizer()
      assert unraisables == []
      interrupts.raise_if_received()
  assert unraisables == []


def test_disposals_failing_after_an_interrupt_are_quiet_also_at_exit(
    unraisables,
):
  unraisables = unraisables()

  def fail():
    raise RuntimeError('disposal after the interrupt')

  with pytest.raises(KeyboardInterrupt):
    with interrupts.handled():
      signal.raise_signal(signal.SIGINT)
  value = _Value()
  weakref.finalize(value, fail)
  del value
  gc.collect()
  assert unraisables == []


def test_other_finalizer_errors_still_reach_the_previous_hook(unraisables):
  unraisables = unraisables()

  def fail():
    raise RuntimeError('not an interrupt')

  previous_handler = signal.getsignal(signal.SIGINT)
  with interrupts.handled():
    value = _Value()
    weakref.finalize(value, fail)
    del value
    gc.collect()
    interrupts.raise_if_received()
  assert unraisables == [RuntimeError]
  assert signal.getsignal(signal.SIGINT) is previous_handler
  # Nothing left recorded for the next block.
  interrupts.raise_if_received()


def test_an_ignored_sigint_stays_ignored():
  previous_handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    with interrupts.handled():
      assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
      signal.raise_signal(signal.SIGINT)
      interrupts.raise_if_received()
  finally:
    signal.signal(signal.SIGINT, previous_handler)


def test_an_interrupt_in_a_deferred_block_is_raised_when_it_ends():
  finished = []
  with pytest.raises(KeyboardInterrupt):
    with interrupts.handled():
      with interrupts.deferred():
        signal.raise_signal(signal.SIGINT)
        # Not raised here: the block (a round's release and checkpoint)
        # finishes first.
        finished.append('written')
      finished.append('not reached')
  assert finished == ['written']


def test_deferred_outside_handled_leaves_sigint_alone():
  with interrupts.deferred():
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
  with pytest.raises(KeyboardInterrupt):
    with interrupts.deferred():
      signal.raise_signal(signal.SIGINT)
