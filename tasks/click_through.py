"""MovieLens as a click-through task: RF²'s data (Maeng et al., RecSys '22,
Sec. 5.1, and the authors' MovieLens pipeline, `../shared/specs/rf2.md`
section 4).

Every rating is an event; a rating of at least `click_rating` (5 stars) is
a click (label 1), any other a non-click (label 0). An event's features are
the movie, the movie's genres (a bag, mean-pooled by the models) and the
last `history_length` (10) movies the user clicked before the event, in
time order; the user id is not a feature. Each user's events are sorted by
time (ties in file order) and the first ceil(0.9 n) go to training, the
rest to test; a test event's history still holds the user's earlier test
clicks, as in the authors' code.

Ids: items and users are numbered in sorted order of their ids. `genres`
and `history` are padded with 0, so genre g is stored as g + 1 and item i
as i + 1 there (a padding row of the models' tables is id 0).

Example:
  >>> data = click_through_split(frame, item_genres)
  >>> data.item[data.train], data.label[data.train]
"""

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

CLICK_RATING = 5.0
HISTORY_LENGTH = 10
TRAIN_FRACTION = 0.9


@dataclasses.dataclass(frozen=True)
class ClickThroughData:
  """Labelled events of every user, user-major and in time order.

  Attributes:
    user_ids, item_ids: The original ids of users and items, sorted; user u
      and item i index them.
    genre_names: The genres, sorted; genre g is stored as g + 1.
    offsets: int64 [U + 1]: user u's events are rows offsets[u] to
      offsets[u + 1] - 1.
    user: int32 [N], item: int32 [N]: each event's user and movie.
    genres: int32 [N, G]: the movie's genres + 1, then zeros.
    history: int32 [N, H]: the user's last H clicked movies before the
      event + 1, oldest first, then zeros.
    label: float32 [N]: 1 for a click.
    train: bool [N]: the event is a training one (the first ceil(0.9 n) of
      its user's events).
  """

  user_ids: np.ndarray
  item_ids: np.ndarray
  genre_names: tuple[str, ...]
  offsets: np.ndarray
  user: np.ndarray
  item: np.ndarray
  genres: np.ndarray
  history: np.ndarray
  label: np.ndarray
  train: np.ndarray

  @property
  def num_users(self) -> int:
    return self.user_ids.size

  @property
  def num_items(self) -> int:
    return self.item_ids.size


def _last_clicks(offsets, user, label, item, history_length):
  """history [N, H] of user-major, time-ordered events (module docstring)."""
  clicked = label.astype(bool)
  clicks_before = np.cumsum(clicked) - clicked  # Global count before a row.
  clicked_items = item[clicked]
  clicks_of_user_before = clicks_before - clicks_before[offsets[user]]
  start = clicks_before - np.minimum(clicks_of_user_before, history_length)
  index = start[:, None] + np.arange(history_length)[None, :]
  valid = index < clicks_before[:, None]
  safe = np.minimum(index, max(clicked_items.size - 1, 0))
  gathered = clicked_items[safe] + 1 if clicked_items.size else np.zeros_like(
      index)
  return np.where(valid, gathered, 0).astype(np.int32)


def click_through_split(
    frame: pd.DataFrame,
    item_genres: Mapping[str, Sequence[str]],
    *,
    click_rating: float = CLICK_RATING,
    history_length: int = HISTORY_LENGTH,
    train_fraction: float = TRAIN_FRACTION,
) -> ClickThroughData:
  """The click-through events of rating rows (module docstring).

  Args:
    frame: Columns user, item, rating, timestamp (as
      `movielens.load_movielens` gives them).
    item_genres: {item id: its genres} (`movielens.load_movie_genres`);
      every item of `frame` must have an entry (it may be empty).
    click_rating: Ratings at least this are clicks.
    history_length: H.
    train_fraction: The share of each user's events, earliest first, that
      train (rounded up).
  """
  if not 0 < train_fraction <= 1:
    raise ValueError(
        f'train_fraction must be in (0, 1]; got {train_fraction}.')
  if history_length < 1:
    raise ValueError(f'history_length must be >= 1; got {history_length}.')
  user_ids, user = np.unique(frame['user'].to_numpy(), return_inverse=True)
  item_ids, item = np.unique(frame['item'].to_numpy(), return_inverse=True)
  missing = [i for i in item_ids.tolist() if i not in item_genres]
  if missing:
    raise ValueError(
        f'{len(missing)} items have no genres entry, e.g. {missing[:3]}: '
        'give the movie file of the same data set.')
  genre_names = tuple(sorted({g for i in item_ids.tolist()
                              for g in item_genres[i]}))
  genre_index = {g: k + 1 for k, g in enumerate(genre_names)}
  width = max(1, max(len(item_genres[i]) for i in item_ids.tolist()))
  item_genre_table = np.zeros([item_ids.size, width], np.int32)
  for row, item_id in enumerate(item_ids.tolist()):
    ids = [genre_index[g] for g in item_genres[item_id]]
    item_genre_table[row, :len(ids)] = ids

  order = np.lexsort((np.arange(len(frame)),
                      frame['timestamp'].to_numpy(np.float64), user))
  user, item = user[order].astype(np.int32), item[order].astype(np.int32)
  label = (frame['rating'].to_numpy(np.float64)[order]
           >= click_rating).astype(np.float32)
  counts = np.bincount(user, minlength=user_ids.size)
  offsets = np.r_[0, np.cumsum(counts)].astype(np.int64)
  position = np.arange(user.size) - offsets[user]
  train = position < np.ceil(train_fraction * counts[user])
  return ClickThroughData(
      user_ids=user_ids, item_ids=item_ids, genre_names=genre_names,
      offsets=offsets, user=user, item=item,
      genres=item_genre_table[item],
      history=_last_clicks(offsets, user, label, item, history_length),
      label=label, train=train,
  )


def clicks_per_user(data: ClickThroughData, rows=None) -> tuple:
  """CSR (offsets int64 [U + 1], item indices) of each user's clicks among
  the events `rows` selects (bool [N]; None: every event), in time order:
  the clicks `device_tiers.dirichlet` maps users by."""
  clicked = data.label > 0
  if rows is not None:
    clicked &= rows
  counts = np.bincount(data.user[clicked], minlength=data.num_users)
  return np.r_[0, np.cumsum(counts)].astype(np.int64), data.item[clicked]


def item_click_rate_scores(data: ClickThroughData) -> np.ndarray:
  """float [N]: each event's movie's click rate over the training events
  (the overall training click rate for a movie no training event has): a
  floor a click-through model must beat."""
  train = data.train
  shown = np.bincount(data.item[train], minlength=data.num_items)
  clicked = np.bincount(data.item[train], weights=data.label[train],
                        minlength=data.num_items)
  overall = data.label[train].mean()
  rate = np.where(shown > 0, clicked / np.maximum(shown, 1), overall)
  return rate[data.item]
