"""An export's Ctrl-C that a finalizer swallowed still stops it, before it
writes anything more (`tests/export_test.py` sends real SIGINTs to a
running export; where the signal lands inside a finalizer, as jax's
`_xla_gc_callback`, Python ignores the KeyboardInterrupt)."""

import gc
import signal
import weakref

import pytest

from tff_fedrec.programs import export_program
from tff_fedrec.programs import interrupts


class _Value:
  pass


def test_an_interrupt_a_finalizer_swallowed_stops_the_export(tmp_path):
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    with pytest.raises(KeyboardInterrupt):
      with interrupts.handled():
        value = _Value()
        weakref.finalize(value, signal.raise_signal, signal.SIGINT)
        del value
        gc.collect()  # The interrupt is raised, and swallowed, in here.
        export_program._write_export(  # pylint: disable=protected-access
            None, 1, [], ['float32'], tmp_path)
  finally:
    signal.signal(signal.SIGINT, previous)
  assert not list(tmp_path.iterdir())
