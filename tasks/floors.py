"""The floors a ranking protocol's figures are read against: what a model
that learns nothing shared reaches on the same split (the protocol audit,
issue 42; `programs/audit`).

  memorizer   a private score s[u, i] per user and item, ~0 at the start,
              trained by gradient steps on the BCE of the user's own
              examples of each round the protocol draws (its positives and
              its sampled negatives; step 1.0, one step a round), and
              nothing else: no parameter is shared, so whatever it reaches
              above chance it gets from remembering which items the
              protocol showed the user as negatives;
  popularity  every user ranks items by their training interactions;
  chance      the expected figure of a uniformly random ranking (each
              protocol's `chance`).

Under the papers' leave-one-out pool (negatives from the items a user
never interacted with) the held-out item is never a training negative and
its negatives are, so the memorizer's positive keeps 0 while its
negatives fall: it passes chance by far. Under the leak-free pool the
held-out item is drawn as often as its negatives, and the memorizer stays
near chance (`docs/results/apfr_gkd.md`).

Example:
  >>> result = floors(protocol, rounds=20)
  >>> result['memorizer']['hr@10'], result['chance']['hr@10']
  >>> warnings(result)
"""

import numpy as np

# A floor is suspicious when the memorizer passes chance by this factor.
CHANCE_FACTOR = 2.0
_STEP = 1.0
_TIE_NOISE = 1e-3
_METRIC_NAMES = {'hr@10': 'HR@10', 'recall@20': 'Recall@20'}


# The memorizer's scores are dense, [users, items]: past this many of
# them (512 MB of float32) it remembers a seeded sample of the users (each
# user's memorizer is its own, so their mean is an unbiased estimate of
# every user's): a million users of 1,000 items would need 4 GB.
MEMORIZER_MAX_SCORES = 1 << 27
_SAMPLE_SEED = 20261203


def memorizer_users(num_users: int, num_items: int) -> np.ndarray:
  """int64 [S], ascending: the users the memorizer remembers, every user
  while `num_users x num_items` is at most `MEMORIZER_MAX_SCORES`, else a
  seeded sample of as many as fit."""
  if num_users * num_items <= MEMORIZER_MAX_SCORES:
    return np.arange(num_users, dtype=np.int64)
  count = max(1, MEMORIZER_MAX_SCORES // num_items)
  return np.sort(np.random.default_rng(_SAMPLE_SEED).choice(
      num_users, count, replace=False)).astype(np.int64)


def memorizer_scores(protocol, rounds: int, seed: int = 0,
                     users: np.ndarray = None) -> np.ndarray:
  """float32 [S, I]: the memorizer's scores of `users` (int [S],
  ascending; None: every user) after `rounds` rounds of the protocol's
  own draws (`Protocol.round_input`: its users, positives and sampled
  negatives). They start at uniform noise in [0, 1e-3), far below one
  step (0.5 at 0), so items it never saw tie at random, not by index (a
  full ranking's tie-break, which would hand it the order of the item
  ids)."""
  data = protocol.data
  if users is None:
    users = np.arange(data.num_users, dtype=np.int64)
  row_of = np.full([data.num_users], -1, np.int64)
  row_of[users] = np.arange(users.size)
  scores = np.random.default_rng(seed).uniform(
      0.0, _TIE_NOISE, [users.size, data.num_items]).astype(np.float32)
  for round_num in range(rounds):
    round_input = protocol.round_input(round_num)
    rows = np.repeat(row_of[np.asarray(round_input.users, np.int64)],
                     [len(d['items']) for d in round_input.user_data])
    if not rows.size:
      continue
    items = np.concatenate([d['items'] for d in round_input.user_data])
    labels = np.concatenate([d['labels'] for d in round_input.user_data])
    remembered = rows >= 0
    rows, items, labels = rows[remembered], items[remembered], labels[
        remembered]
    # One full-batch gradient step of each user's BCE from the round's
    # scores: d/ds of -[y log p + (1 - y) log (1 - p)] is p - y.
    gradient = 1.0 / (1.0 + np.exp(-scores[rows, items])) - labels
    np.add.at(scores, (rows, items), -_STEP * gradient)
  return scores


def popularity_scores(data) -> np.ndarray:
  """float32 [I]: each item's training interactions."""
  return np.bincount(data.train_items,
                     minlength=data.num_items).astype(np.float32)


def floors(protocol, rounds: int) -> dict:
  """{'metric', 'rounds', 'memorizer', 'popularity', 'chance'}: the test
  figures of each floor under the protocol (its `test_metrics`, every
  user; the memorizer's over `memorizer_users`, whose count is
  'memorizer_users' when it is a sample) and the metric the warnings
  read."""
  data = protocol.data
  remembered = memorizer_users(data.num_users, data.num_items)
  memorized = memorizer_scores(protocol, rounds, users=remembered)
  popularity = popularity_scores(data)
  result = {
      'metric': protocol.fairness_metric,
      'rounds': rounds,
      'memorizer': protocol.test_metrics(
          remembered, lambda position, items: memorized[position, items]),
      'popularity': protocol.test_metrics(
          np.arange(data.num_users),
          lambda position, items: popularity[items]),
      'chance': protocol.chance(),
  }
  if remembered.size < data.num_users:
    result['memorizer_users'] = int(remembered.size)
  return result


def warnings(result: dict) -> list[str]:
  """What is suspicious about a protocol whose floors are `result`."""
  metric = result['metric']
  memorizer = result['memorizer'][metric]
  chance_value = result['chance'][metric]
  popularity = result['popularity'][metric]
  found = []
  if memorizer > CHANCE_FACTOR * chance_value:
    found.append(
        f'a memorizer that shares nothing reaches {metric} {memorizer:.4f}, '
        f'{memorizer / chance_value:.1f}x chance ({chance_value:.4f}): the '
        'protocol rewards remembering the items it showed each user as '
        'negatives (e.g. its held-out items are never training negatives; '
        'leave-one-out: try --negative_pool=outside_training).')
  if memorizer > popularity:
    found.append(
        f'the memorizer ({metric} {memorizer:.4f}) beats the popularity '
        f'ranking ({popularity:.4f}): a figure between them may be '
        'memorization, not recommendation.')
  return found


def lines(result: dict) -> list[str]:
  """The audit's closing lines: one per floor in the protocol's metric,
  then a 'WARNING:' line per warning."""
  metric = result['metric']
  shown = _METRIC_NAMES.get(metric, metric)
  return [
      *(f'{floor} {shown} {result[floor][metric]:.4f}'
        for floor in ('memorizer', 'popularity', 'chance')),
      *(f'WARNING: {text}' for text in warnings(result)),
  ]
