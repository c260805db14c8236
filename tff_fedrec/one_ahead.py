"""An iterable's next item made on a thread while the caller uses this one.

The program's numpy work between two calls into the TFF worker (drawing a
round's negatives, building a cohort's compact tables) can overlap the
worker's training, which waits on gRPC, not on the program. `one_ahead`
runs the iterable on one background thread, one item ahead: every item is
made on that one thread, one after another (a producer that caches what it
made needs no lock), at most two are alive at once, and an item's error is
raised in the caller when its turn comes.

Used by `templates.user_groups` (the next cohort's inputs) and the training
loop (the next round's input).

Example:
  >>> for cohort_input in one_ahead(make(cohort) for cohort in cohorts):
  ...   train(cohort_input)  # the next cohort's input is made meanwhile
"""

from concurrent import futures
from collections.abc import Iterable, Iterator
from typing import TypeVar

_Item = TypeVar('_Item')


def one_ahead(iterable: Iterable[_Item], *,
              thread_name: str = 'one-ahead') -> Iterator[_Item]:
  """`iterable`'s items in order, each next one made on a thread while the
  caller works on the current one. Closing the generator (or leaving a
  `contextlib.closing` block) waits for an item being made."""
  done = object()
  with futures.ThreadPoolExecutor(
      max_workers=1, thread_name_prefix=thread_name) as executor:
    iterator = iter(iterable)
    pending = executor.submit(next, iterator, done)
    while True:
      item = pending.result()
      if item is done:
        return
      pending = executor.submit(next, iterator, done)
      yield item
      del item
