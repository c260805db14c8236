"""Round inputs drawn one round ahead, while the current round trains.

A protocol's `round_input(r)` is a function of (seed, r) alone
(`tasks.protocol.Protocol.round_input`), and drawing it is numpy work in
the program (ML-1M: 4 million negatives sampled and shuffled, about 1.7 s
a round here) while the round itself waits mostly on the TFF worker. So
the loop asks for round r's input and, as it hands it over, starts drawing
round r + 1's on one background thread: each round's input is the one an
unprefetched run draws, and the drawing of the next overlaps the worker's
training of this one. Every call of `round_input` runs on that one thread,
one after another, so a protocol that caches what it drew once needs no
lock.

Example:
  >>> with Prefetched(protocol.round_input, rounds=100) as inputs:
  ...   for round_num in range(start, 100):
  ...     round_input = inputs.get(round_num)  # round_num + 1 is drawn now
"""

from concurrent import futures
from typing import Callable


class Prefetched:
  """`round_input(r)` for r in order, r + 1 drawn while r is used."""

  def __init__(self, round_input: Callable[[int], object], *, rounds: int):
    self._round_input = round_input
    self._rounds = rounds
    self._executor = futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix='round-input')
    self._pending = {}

  def get(self, round_num: int):
    """Round `round_num`'s input (its errors raised here); starts drawing
    the next round's unless `round_num` is the last."""
    future = self._pending.pop(round_num, None)
    for stale in self._pending.values():
      stale.cancel()
    self._pending.clear()
    if future is None:
      future = self._executor.submit(self._round_input, round_num)
    round_input = future.result()
    if round_num + 1 < self._rounds:
      self._pending[round_num + 1] = self._executor.submit(
          self._round_input, round_num + 1)
    return round_input

  def close(self) -> None:
    """Drops a pending draw and waits for a running one to end."""
    for pending in self._pending.values():
      pending.cancel()
    self._pending.clear()
    self._executor.shutdown(wait=True, cancel_futures=True)

  def __enter__(self) -> 'Prefetched':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
