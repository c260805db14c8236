"""Which preset flag file a method runs with (`programs/presets/`).

A preset is `<method>_<data set without dashes>.flags`. A variant without
one of its own (an ablation, `registry.base_method`) runs with its base
method's, so that it differs from the method it ablates in the ablation
alone: `apfr_gkd_no_kd` on ML-100K takes `apfr_gkd_ml100k.flags`.

Example:
  >>> preset_flags('apfr_gkd_no_kd', 'ml-100k')
  ['--flagfile=.../presets/apfr_gkd_ml100k.flags']
"""

import os
from typing import Optional

from tff_fedrec.algorithms import registry

PRESET_DIR = os.path.join(os.path.dirname(__file__), 'presets')


def preset_path(method: str, dataset: str) -> Optional[str]:
  """The preset `method` runs with on `dataset`, or None."""
  for name in (method, registry.base_method(method)):
    if name is None:
      continue
    path = os.path.join(PRESET_DIR, f'{name}_{dataset.replace("-", "")}.flags')
    if os.path.exists(path):
      return path
  return None


def preset_flags(method: str, dataset: str) -> list[str]:
  """The train program's flags of `method`'s preset on `dataset`; without
  one, the method and the data set (the defaults otherwise). The caller's
  --method then names `method`."""
  path = preset_path(method, dataset)
  if path is not None:
    return [f'--flagfile={path}']
  return [f'--method={method}', f'--dataset={dataset}']
