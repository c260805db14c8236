"""The click-through task against a per-user, per-event reading of the
authors' MovieLens pipeline (spec section 4)."""

import math

import numpy as np
import pandas as pd
import pytest

from tff_fedrec.tasks import click_through

_GENRES = {'m0': ('Drama',), 'm1': ('Comedy', 'Drama'), 'm2': (),
           'm3': ('Action', 'Comedy', 'War'), 'm4': ('War',)}


def _frame(seed, num_rows=300):
  rng = np.random.default_rng(seed)
  return pd.DataFrame({
      'user': rng.choice(['u1', 'u2', 'u10', 'u3'], num_rows),
      'item': rng.choice(sorted(_GENRES), num_rows),
      'rating': rng.integers(1, 6, num_rows).astype(np.float64),
      # Few distinct times: ties within a user are common.
      'timestamp': rng.integers(0, 40, num_rows).astype(np.float64),
  })


def _reference(frame, history_length, train_fraction):
  """{(user id, position in time order): (item id, label, history ids,
  train)} by walking each user's events."""
  events = {}
  for user_id, rows in frame.groupby('user', sort=True):
    # Time order, ties in file order.
    rows = rows.reset_index().sort_values(['timestamp', 'index'],
                                          kind='stable')
    clicks = []
    cut = math.ceil(train_fraction * len(rows))
    for position, row in enumerate(rows.itertuples()):
      label = 1.0 if row.rating >= 5 else 0.0
      events[(user_id, position)] = (
          row.item, label, tuple(clicks[-history_length:]), position < cut)
      if label:
        clicks.append(row.item)
  return events


@pytest.mark.parametrize('seed, history_length, train_fraction', [
    (0, 10, 0.9), (1, 3, 0.9), (2, 1, 0.5), (3, 4, 1.0)])
def test_events_match_a_walk_through_each_user_s_time_line(
    seed, history_length, train_fraction):
  frame = _frame(seed)
  data = click_through.click_through_split(
      frame, _GENRES, history_length=history_length,
      train_fraction=train_fraction)
  expected = _reference(frame, history_length, train_fraction)
  assert data.user_ids.tolist() == sorted(frame['user'].unique())
  assert data.item.size == len(expected) == len(frame)
  for row in range(data.item.size):
    user = data.user[row]
    position = row - data.offsets[user]
    item, label, history, train = expected[(data.user_ids[user], position)]
    assert data.item_ids[data.item[row]] == item
    assert data.label[row] == label
    assert data.train[row] == train
    stored = [data.item_ids[i - 1] for i in data.history[row] if i]
    assert tuple(stored) == history
    # Padding only after the history.
    assert not np.any(data.history[row, len(history):])
    genres = [data.genre_names[g - 1] for g in data.genres[row] if g]
    assert tuple(genres) == _GENRES[item]


def test_genres_and_refusals():
  data = click_through.click_through_split(_frame(0), _GENRES)
  assert data.genre_names == ('Action', 'Comedy', 'Drama', 'War')
  assert data.genres.shape[1] == 3  # The most genres of one movie.
  with pytest.raises(ValueError, match='no genres entry'):
    click_through.click_through_split(_frame(0), {'m0': ('Drama',)})
  with pytest.raises(ValueError, match='train_fraction'):
    click_through.click_through_split(_frame(0), _GENRES, train_fraction=0)


def test_item_click_rate_scores_use_training_events_only():
  frame = pd.DataFrame({
      'user': ['a'] * 4 + ['b'] * 4,
      'item': ['m0', 'm0', 'm1', 'm2', 'm0', 'm1', 'm1', 'm0'],
      'rating': [5, 1, 5, 5, 5, 2, 2, 5],
      'timestamp': [0, 1, 2, 3, 0, 1, 2, 3],
  })
  data = click_through.click_through_split(frame, _GENRES,
                                           train_fraction=0.75)
  scores = click_through.item_click_rate_scores(data)
  # Training: a's first 3 (m0 click, m0 no, m1 click), b's first 3 (m0
  # click, m1 no, m1 no): m0 2 of 3, m1 1 of 3; m2 only in test: the
  # overall training rate, 3 of 6.
  rate = {'m0': 2 / 3, 'm1': 1 / 3, 'm2': 0.5}
  expected = [rate[data.item_ids[i]] for i in data.item]
  np.testing.assert_allclose(scores, expected)


def test_clicks_per_user_are_each_user_s_clicked_items_in_time_order():
  frame = _frame(4)
  data = click_through.click_through_split(frame, _GENRES)
  expected = _reference(frame, 10, 0.9)
  for rows in (None, data.train):
    offsets, items = click_through.clicks_per_user(data, rows)
    for user, user_id in enumerate(data.user_ids):
      walked = [item for (who, _), (item, label, _, train)
                in sorted(expected.items())
                if who == user_id and label and (rows is None or train)]
      got = [data.item_ids[i] for i in items[offsets[user]:offsets[user + 1]]]
      assert got == walked
