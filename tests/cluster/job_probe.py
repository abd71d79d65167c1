"""A tiny rank for job tests: says where it runs and what argv it got, reports signals, sleeps.

No torch: it starts in milliseconds. PROBE_SLEEP_S (env) sets how long it stays up.
"""

import json
import os
import signal
import socket
import sys
import time

rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "?"))
world = os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "?"))


def on_signal(signum: int, frame: object) -> None:
    print(f"rank {rank} got {signal.Signals(signum).name}\n", end="", flush=True)


for sig in (signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(sig, on_signal)
print(f"rank {rank} of {world} on {socket.gethostname()} pid {os.getpid()} argv={json.dumps(sys.argv[1:])}\n",
      end="", flush=True)
deadline = time.monotonic() + float(os.environ.get("PROBE_SLEEP_S", "0"))
while time.monotonic() < deadline:
    time.sleep(0.05)
print(f"rank {rank} done\n", end="", flush=True)
