r"""Probe: what a round's cohorts would gain on two lanes.

Runs the train program with `templates.cohorts.run_round` replaced by a
two-lane version: two TFF execution contexts on the program's one worker
(TFF's context stack is thread-local, and its Python remote executor makes
blocking gRPC calls inside the context's event loop, so one context runs
one computation at a time), each lane taking the next cohort as soon as it
is free, the cohorts' client states stored in cohort order and their
partial aggregates merged in cohort order after the last (the figures are
those of the one-lane round, to the bit, where the merges are).

  .venv/bin/python benchmarks/cohort_lanes_probe.py \
      --flagfile=programs/presets/pfedrec_ml1m.flags --rounds=10 \
      --cohort_size=256 --root_dir=runs/lanes_probe

A probe, not a feature: a lane's worker failure is not handled as the
program handles the main context's (`execution`), and two cohorts are in
flight, so memory follows twice the cohort size. docs/results/scale.md has
its figures beside the one-lane round's.
"""

import itertools
import sys
import threading

from absl import app
import tensorflow_federated as tff

from tff_fedrec.programs import execution
from tff_fedrec.programs import training_program
from tff_fedrec.templates import cohorts as cohorts_lib

_make_remote_context = execution.make_remote_context
# The address of the worker the program's context talks to, and a second
# context on it per address.
_ADDRESSES = []
_SECOND_CONTEXTS = {}


def _recording_make_remote_context(address, **kwargs):
  _ADDRESSES.append(address)
  return _make_remote_context(address, **kwargs)


def _two_lane_round(process, server_state, cohorts, put_results):
  """`cohorts.run_round`, its cohorts on two lanes (module docstring)."""
  round_ = cohorts_lib.cohort_round(process)
  context_stack = tff.framework.get_context_stack()
  address = _ADDRESSES[-1]
  if address not in _SECOND_CONTEXTS:
    _SECOND_CONTEXTS[address] = _make_remote_context(address)
  contexts = (context_stack.current, _SECOND_CONTEXTS[address])
  source = iter(cohorts)
  numbers = itertools.count()
  taking = threading.Lock()
  finished = threading.Condition()
  results, errors = {}, []

  def lane(context):
    context_stack.set_default_context(context)
    try:
      while True:
        with taking:
          try:
            local_states, client_data = next(source)
          except StopIteration:
            return
          index = next(numbers)
        step = round_.step(server_state, local_states, client_data)
        with finished:
          results[index] = (client_data, step)
          finished.notify_all()
    except BaseException as error:  # Raised in the main thread.
      with finished:
        errors.append(error)
        finished.notify_all()

  threads = [threading.Thread(target=lane, args=(context,), daemon=True)
             for context in contexts]
  for thread in threads:
    thread.start()
  partials = []
  for index in itertools.count():
    with finished:
      while (index not in results and not errors
             and any(thread.is_alive() for thread in threads)):
        finished.wait(0.05)
      if errors:
        raise errors[0]
      if index not in results:
        break
      client_data, (new_locals, partial) = results.pop(index)
    put_results(index, client_data, new_locals)
    partials.append(partial)
  for thread in threads:
    thread.join()
  merged = None
  for partial in partials:
    merged = round_.merge(merged, partial)
  return round_.finish(server_state, merged)


if __name__ == '__main__':
  execution.make_remote_context = _recording_make_remote_context
  cohorts_lib.run_round = _two_lane_round
  app.run(training_program.main,
          argv=training_program.flagfiles_first(sys.argv))
