import contextlib
import threading

import pytest

from tff_fedrec import one_ahead as one_ahead_lib


def test_every_item_in_order_the_next_made_meanwhile_on_one_other_thread():
  making_second = threading.Event()
  threads = []

  def items():
    for index in range(4):
      threads.append(threading.current_thread().name)
      if index == 1:
        making_second.set()
      yield index

  seen = []
  for item in one_ahead_lib.one_ahead(items()):
    if item == 0:
      # Item 1 is made while the caller still holds item 0 (a generator
      # run lazily would wait here for ever).
      assert making_second.wait(timeout=30)
    seen.append(item)
  assert seen == [0, 1, 2, 3]
  assert len(set(threads)) == 1
  assert threads[0] != threading.current_thread().name


def test_an_item_that_fails_raises_in_the_caller_when_its_turn_comes():
  def items():
    yield 0
    raise ValueError('no data for round 1')

  iterator = one_ahead_lib.one_ahead(items())
  assert next(iterator) == 0
  with pytest.raises(ValueError, match='no data for round 1'):
    next(iterator)


def test_closing_early_makes_nothing_past_the_item_ahead():
  made = []

  def items():
    for index in range(10):
      made.append(index)
      yield index

  with contextlib.closing(one_ahead_lib.one_ahead(items())) as iterator:
    assert next(iterator) == 0
  # Item 1 was being made ahead; nothing after it.
  assert made == [0, 1]
