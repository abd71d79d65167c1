"""A worker that stops on SIGTERM the way the Trainer does, without torch: it records the signal, then
"saves" for SAVE_S seconds, writes DIR/saved-RANK and exits 75 (PREEMPTED_EXIT_CODE).

    python -m torchslurm.cli.agent --standalone --nproc-per-node=2 stop_on_term.py DIR SAVE_S

Writes DIR/pid-RANK once its handler is in place.
"""

import os
import signal
import sys
import time
from pathlib import Path

folder, save_s, rank = Path(sys.argv[1]), float(sys.argv[2]), os.environ["RANK"]
received: list[int] = []
signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
(folder / f"pid-{rank}").write_text(str(os.getpid()))
while not received:
    time.sleep(0.02)
time.sleep(save_s)  # the checkpoint, during which more SIGTERMs may come
(folder / f"saved-{rank}").write_text("")
sys.exit(75)
