"""Flags of the data set a run loads (group `data`, every run)."""

from absl import flags

from tff_fedrec.programs.flag_groups import group
from tff_fedrec.tasks import datasets

DATASET = flags.DEFINE_enum(
    'dataset', None, list(datasets.NAMED_DATASETS),
    'Named data set. Without it, --data_path loads a local interactions file.',
)
DATA_PATH = flags.DEFINE_string(
    'data_path', None,
    'Local interactions file (user,item,rating,timestamp). Alone it is the '
    'data set; with --dataset=ml-100k/ml-1m it replaces the download.',
)
SEPARATOR = flags.DEFINE_string(
    'separator', None,
    'Field separator of --data_path, e.g. "::" or "\\t" (default: "," for a '
    'plain file, a tab for a MovieLens copy).'
)
HEADER = flags.DEFINE_enum(
    'header', 'auto', ['auto', 'true', 'false'], 'Header line in --data_path.'
)
MIN_INTERACTIONS = flags.DEFINE_integer(
    'min_interactions', 0,
    'Drop users with fewer interactions (the paper uses 5 for Lastfm-2K and '
    'Amazon-Video; leave-one-out needs at least 3).',
)
SYNTHETIC_USERS = flags.DEFINE_integer(
    'synthetic_users', 200, 'Users of --dataset=synthetic.'
)
SYNTHETIC_ITEMS = flags.DEFINE_integer(
    'synthetic_items', 500, 'Items of --dataset=synthetic.'
)
CACHE_DIR = flags.DEFINE_string(
    'cache_dir', None, 'Download cache (default $TFF_FEDREC_CACHE or '
    '~/.cache/tff_fedrec).',
)


# The synthetic generator's largest sizes: every user's interactions and the
# item popularity are drawn in memory.
MAX_SYNTHETIC_USERS = 100_000_000
MAX_SYNTHETIC_ITEMS = 10_000_000


def data_config(seed: int) -> datasets.DataConfig:
  """The data set the flags name, seeded by `seed`."""
  dataset = DATASET.value
  if dataset is None:
    if not DATA_PATH.value:
      raise group.FlagError(
          'Give --dataset=ml-100k|ml-1m|synthetic, or --data_path=FILE for a '
          'local interactions file.'
      )
    dataset = 'file'
  elif dataset == 'synthetic' and DATA_PATH.value:
    raise group.FlagError(
        '--data_path cannot be combined with --dataset=synthetic.'
    )
  header = {'auto': 'auto', 'true': True, 'false': False}[HEADER.value]
  return datasets.DataConfig(
      dataset=dataset,
      data_path=DATA_PATH.value,
      separator=separator(),
      header=header,
      cache_dir=CACHE_DIR.value,
      synthetic_users=SYNTHETIC_USERS.value,
      synthetic_items=SYNTHETIC_ITEMS.value,
      min_interactions_per_user=MIN_INTERACTIONS.value,
      seed=seed,
  )


def separator():
  """--separator with its backslash escapes (\\t, \\x1f) resolved, or None."""
  if SEPARATOR.value is None:
    return None
  try:
    # Latin-1 with backslash escapes for the rest: a non-ASCII separator
    # ('¦', '€') comes back as itself, not as the bytes of its UTF-8.
    return SEPARATOR.value.encode('latin-1', 'backslashreplace').decode(
        'unicode_escape')
  except UnicodeDecodeError as error:
    raise group.FlagError(
        f"--separator='{SEPARATOR.value}' is not a valid escape "
        f'({error.reason}). Give the separator itself (--separator=";") or '
        'a complete escape such as --separator="\\t" or "\\x1f"; a '
        'literal backslash is "\\\\".'
    ) from None


def _check(entry) -> None:
  del entry
  data_config(seed=0)
  if MIN_INTERACTIONS.value < 0:
    raise group.FlagError(
        f'--min_interactions must be >= 0; got {MIN_INTERACTIONS.value}.')
  group.require_positive(SYNTHETIC_USERS, SYNTHETIC_ITEMS)
  group.require_at_most(SYNTHETIC_USERS, MAX_SYNTHETIC_USERS)
  group.require_at_most(SYNTHETIC_ITEMS, MAX_SYNTHETIC_ITEMS)
  if SEPARATOR.value == '':
    raise group.FlagError(
        '--separator must not be empty (e.g. --separator=, or '
        '--separator="\\t").')


GROUPS = (
    group.FlagGroup(
        'data', 'the data set',
        (DATASET, DATA_PATH, SEPARATOR, HEADER, MIN_INTERACTIONS,
         SYNTHETIC_USERS, SYNTHETIC_ITEMS, CACHE_DIR),
        check=_check,
    ),
)
