"""Rank 1 exits with code 7 after init; the others stay busy until the launcher stops them.

They do not wait in a collective: that would fail within the same agent poll as rank 1's exit,
and the launcher's failure timestamps (whole seconds) could no longer tell which came first.
"""

import os
import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    print("rank 1: failing on purpose", file=sys.stderr, flush=True)
    os._exit(7)
time.sleep(120)
