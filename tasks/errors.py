"""Errors raised by the data layer.

Both are raised for problems the user can fix without reading our code, so each
message names what was wrong and what to do about it.
"""


class DataFormatError(ValueError):
  """Input data is malformed.

  The message names the file and, where there is one, the 1-based line
  number, then the problem and the fix, e.g.
  `ratings.dat:17: expected 4 fields ..., found 3. ... pass --separator=...`.
  """


class DatasetFetchError(RuntimeError):
  """A data set could not be fetched.

  The message names what was being fetched, why it failed and what to do,
  e.g. `pass --data_path=/path/to/ml-100k.inter to use a local copy`.
  """
