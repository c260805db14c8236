"""Ctrl-C in a training run: one message, never a finalizer's traceback.

Python runs a SIGINT's handler at the next bytecode boundary, wherever that is.
In a TFF run it is often inside a weakref finalizer (TFF disposes of remote
values from finalizers, and so does TensorFlow of its resources). There the
`KeyboardInterrupt` cannot propagate: Python prints "Exception ignored in:
<finalize object ...>" with a traceback and carries on, and the Ctrl-C is lost.
The values disposed of while the interrupt unwinds fail the same way.

`handled()` installs a SIGINT handler that records the interrupt before it
raises, and an unraisable-exception hook that keeps quiet about an interrupt
swallowed by a finalizer and about the disposals that fail once it has come.
The training loop calls `raise_if_received()` after every round, so an
interrupt a finalizer swallowed still stops the run there, with its rounds
saved. It writes a round's metrics and checkpoint inside `deferred()`,
where a Ctrl-C is recorded and raised once the writing is done: raised
inside the asyncio task of a TFF release manager, the interrupt would
leave that task's traceback on stderr ("Task exception was never
retrieved").
"""

import contextlib
import signal
import sys
import threading
from typing import Iterator

_received = threading.Event()


def _record_and_raise(signum, frame):
  del signum, frame
  _received.set()
  raise KeyboardInterrupt


def _record(signum, frame):
  del signum, frame
  _received.set()


def _quiet_after_interrupt_hook(previous, received: threading.Event):
  def hook(unraisable):
    if received.is_set() or isinstance(
        unraisable.exc_value, KeyboardInterrupt
    ):
      received.set()
      return
    previous(unraisable)

  return hook


@contextlib.contextmanager
def handled() -> Iterator[None]:
  """Within the block, Ctrl-C is recorded and finalizers stay quiet about it.

  Must be entered in the main thread (signal handlers are set there). A
  SIGINT ignored when the block starts stays ignored. Restores the previous
  handler on exit, and the previous hook unless an interrupt came (its
  unwinding leaves finalizers to run at exit).
  """
  global _received
  previous_handler = signal.getsignal(signal.SIGINT)
  previous_hook = sys.unraisablehook
  _received = threading.Event()
  if previous_handler is not signal.SIG_IGN:
    # A process started with SIGINT ignored (`cmd &` in a script) keeps it so.
    signal.signal(signal.SIGINT, _record_and_raise)
  sys.unraisablehook = _quiet_after_interrupt_hook(previous_hook, _received)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, previous_handler)
    if not _received.is_set():
      sys.unraisablehook = previous_hook
    _received = threading.Event()


@contextlib.contextmanager
def deferred() -> Iterator[None]:
  """Within `handled()`, a Ctrl-C during the block is recorded and raised
  when the block ends (module docstring); elsewhere, nothing changes."""
  current = signal.getsignal(signal.SIGINT)
  if current is not _record_and_raise:
    yield
    return
  signal.signal(signal.SIGINT, _record)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, current)
  raise_if_received()


def raise_if_received() -> None:
  """Raises `KeyboardInterrupt` if a Ctrl-C came and was swallowed."""
  if _received.is_set():
    raise KeyboardInterrupt
