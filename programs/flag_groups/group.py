"""A group of the training program's flags and what it gives a builder.

A `FlagGroup` holds its flags, checks their values before any data is
loaded (`check`), and turns them into keyword arguments of the method's
builder (`arguments`), with the context of the run (`BuildContext`). Arguments under the key `training` are field values
of the builder's training configuration (its `training` argument), merged
over every group and applied to the builder's own default configuration,
so a flag left at None keeps the method's default.

Example:
  >>> group = FlagGroup('embedding', 'the embedding width', (EMBEDDING_DIM,),
  ...                   lambda context: {'embedding_dim': EMBEDDING_DIM.value})
"""

import dataclasses
import math
from typing import Callable

from absl import flags

from tff_fedrec.algorithms import method as method_lib
from tff_fedrec.algorithms import registry


class FlagError(ValueError):
  """Inconsistent, unusable or missing flags."""


def check_method_names(names) -> bool:
  """The validator of a `--methods` list flag (the benchmark programs'):
  raises `flags.ValidationError` naming the names no method of the
  registry has, and the known ones. Register it with
  `flags.register_validator('methods', check_method_names)`."""
  unknown = [name for name in names if name not in registry.METHODS]
  if unknown:
    raise flags.ValidationError(
        f'Unknown method(s) {", ".join(unknown)} in --methods; choose from '
        f'{", ".join(registry.METHODS)}.'
    )
  return True


@dataclasses.dataclass(frozen=True)
class BuildContext:
  """What a group may read besides its own flags.

  Attributes:
    entry: The chosen method's registry entry.
    data: What the method will be told of the data.
  """

  entry: registry.MethodEntry
  data: method_lib.RunData


@dataclasses.dataclass(frozen=True)
class FlagGroup:
  """A group of flags (module docstring).

  Attributes:
    name: As registry entries name it.
    title: What the flags are for, e.g. "HeteFedRec's training rule".
    holders: Its flags.
    arguments: BuildContext -> builder keyword arguments.
    check: the method's registry entry -> None, raising FlagError for a
      value the method's runs cannot take (before any data is loaded).
  """

  name: str
  title: str
  holders: tuple
  arguments: Callable[[BuildContext], dict] = lambda context: {}
  check: Callable[[registry.MethodEntry], None] = lambda entry: None

  def changed(self) -> list:
    """Its flags given a value other than their default."""
    return changed_flags(self.holders)


def given_fields(*pairs) -> dict:
  """{field: flag value} of the (holder, field) pairs whose flag has a
  value: a flag whose default is None passes nothing unless given, so the
  builder's own default applies, and run.flags (which records every flag
  with a value) rebuilds the same method."""
  return {field: holder.value for holder, field in pairs
          if holder.value is not None}


def changed_flags(holders) -> list:
  """The flags among `holders` given a value other than their default."""
  return [h for h in holders if h.value != flags.FLAGS[h.name].default]


def int_list(name: str, values, length: int = 3) -> tuple[int, ...]:
  """--name's comma-separated integers, `length` of them."""
  try:
    parsed = tuple(int(v) for v in values)
  except ValueError:
    raise FlagError(
        f'--{name} takes comma-separated integers; got {",".join(values)}.'
    ) from None
  if len(parsed) != length:
    raise FlagError(f'--{name} needs {length} values (small, medium, large).')
  return parsed


# The largest count a flag may give: TensorFlow's int32 shapes and loop
# counters, and numpy's C longs, overflow above it.
MAX_COUNT = 2**31 - 1


def require_positive(*holders) -> None:
  """FlagError for the first of `holders` (counts; None is not checked)
  below 1 or above `MAX_COUNT`."""
  for holder in holders:
    if holder.value is not None and holder.value < 1:
      raise FlagError(
          f'--{holder.name} must be at least 1; got {holder.value}.'
      )
    require_at_most(holder, MAX_COUNT)


def require_at_most(holder, limit: int, why: str = '') -> None:
  """FlagError if `holder`'s value (None is not checked) is above `limit`:
  a size that would overflow, or exhaust memory, before it ran."""
  if holder.value is not None and holder.value > limit:
    raise FlagError(
        f'--{holder.name}={holder.value} is too large: at most {limit:,}'
        + (f' ({why})' if why else '') + '.'
    )


def require_finite(*holders, positive: bool = False) -> None:
  """FlagError for the first of `holders` (floats; None is not checked)
  that is not finite, or (`positive`) not above 0."""
  for holder in holders:
    value = holder.value
    if value is None:
      continue
    if not math.isfinite(value) or (positive and value <= 0):
      raise FlagError(
          f'--{holder.name} must be a finite number'
          + (' above 0' if positive else '') + f'; got {value}.'
      )
