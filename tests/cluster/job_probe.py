"""A tiny rank for job tests: says where it runs and what argv it got, reports signals, sleeps.

No torch: it starts in milliseconds. PROBE_SLEEP_S (env) sets how long it stays up at most;
PROBE_AFTER_SIGNAL_S ends it that many seconds after the first signal it reports, and PROBE_STOP_FILE
as soon as that file exists (a test that has seen what it needed lets the job end at once). PROBE_WRAPPED
is said back when set (by a wrapper in the job's python command).
"""

import json
import os
import signal
import socket
import sys
import time

rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "?"))
world = os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "?"))


signalled: list[float] = []


def on_signal(signum: int, frame: object) -> None:
    print(f"rank {rank} got {signal.Signals(signum).name}\n", end="", flush=True)
    signalled.append(time.monotonic())


for sig in (signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(sig, on_signal)
print(f"rank {rank} of {world} on {socket.gethostname()} pid {os.getpid()} argv={json.dumps(sys.argv[1:])}\n",
      end="", flush=True)
if "PROBE_WRAPPED" in os.environ:  # set by the job's python command (`env PROBE_WRAPPED=... python`)
    print(f"rank {rank} wrapped={os.environ['PROBE_WRAPPED']}\n", end="", flush=True)
deadline = time.monotonic() + float(os.environ.get("PROBE_SLEEP_S", "0"))
after_signal = float(os.environ.get("PROBE_AFTER_SIGNAL_S", "inf"))
stop_file = os.environ.get("PROBE_STOP_FILE")
while time.monotonic() < min(deadline, signalled[0] + after_signal if signalled else deadline):
    if stop_file and os.path.exists(stop_file):
        break
    time.sleep(0.05)
print(f"rank {rank} done\n", end="", flush=True)
