"""The TFF `worker_binary` processes this process has started, from /proc.

Standard library only: `tff_fedrec/__init__.py` imports it for its exit
hook, before TensorFlow.
"""

import os


def running_worker_children() -> dict[int, list[bytes]]:
  """This process's live children that run `worker_binary`.

  Returns:
    {PID: its command line}. Zombies (ended, not yet reaped) are left out.
  """
  workers = {}
  task_dir = f'/proc/{os.getpid()}/task'
  for task in os.listdir(task_dir):
    try:
      with open(f'{task_dir}/{task}/children') as f:
        children = f.read().split()
    except OSError:  # The thread ended meanwhile.
      continue
    for pid in children:
      try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
          arguments = f.read().split(b'\0')[:-1]
        with open(f'/proc/{pid}/stat') as f:
          state = f.read().rsplit(')', 1)[1].split()[0]
      except OSError:  # The child ended meanwhile.
        continue
      if (arguments and arguments[0].endswith(b'/worker_binary')
          and state != 'Z'):
        workers[int(pid)] = arguments
  return workers
