"""The library guide's example (docs/library.md, linked from the README)
runs as written."""

import contextlib
import io
import pathlib
import re

import numpy as np


def _example() -> str:
  guide = (pathlib.Path(__file__).resolve().parent.parent / 'docs'
           / 'library.md')
  return re.search(r'```python\n(.*?)```', guide.read_text(),
                   re.DOTALL).group(1)


def test_the_library_guide_example_trains_and_scores():
  namespace = {}
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    exec(compile(_example(), 'docs/library.md', 'exec'), namespace)  # pylint: disable=exec-used
  lines = printed.getvalue().splitlines()
  # Three rounds, each with a finite loss and some bytes uploaded, then the
  # top items of user 0.
  assert [line.split()[0] for line in lines[:3]] == ['0', '1', '2']
  for line in lines[:3]:
    _, loss, uploaded = line.split()
    assert np.isfinite(float(loss)) and float(uploaded) > 0
  assert lines[3].startswith('top items of user 0:')
  assert namespace['scores'].shape == (1, 50)
  # PFedRec's client state: each user's score function and its fine-tuned
  # rows of the items it trained.
  state = namespace['store'].get([2])[0]
  assert set(state['personal_item_ids']) >= {7, 8, 9, 10}
