r"""Runs a TFF executor service (worker) for `--executor=remote` runs.

  python -m tff_fedrec.programs.worker --port=8000

replaces itself with TFF's own `worker_binary --port=8000` (shipped in the
tensorflow-federated wheel), which serves computations over gRPC until it is
stopped. It has no authentication and no TLS: anyone who reaches the port can
run code in it, so keep it on loopback or a private network (the training
program refuses other addresses without `--allow_insecure_remote`).
"""

import os

from absl import app
from absl import flags

from tff_fedrec.programs import execution

_PORT = flags.DEFINE_integer('port', None, 'Port to serve on.', lower_bound=1,
                             upper_bound=65535)
flags.mark_flag_as_required('port')


def main(argv):
  del argv
  binary = execution.worker_binary_path()
  os.execv(binary, [binary, f'--port={_PORT.value}'])


if __name__ == '__main__':
  app.run(main)
