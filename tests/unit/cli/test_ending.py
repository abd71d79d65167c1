"""cli.ending: a torchslurm process ends as Python's exit would, without the interpreter's teardown."""

from __future__ import annotations

import subprocess
import sys

import pytest

ENDING = """
import atexit, concurrent.futures, sys, threading, time
from torchslurm.cli.ending import exit_process
atexit.register(lambda: print("atexit ran"))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread finished"))).start()
idle = concurrent.futures.ThreadPoolExecutor(2)  # never shut down: its worker waits for work (Inductor's pools)
idle.submit(print, "pool worked").result()
sys.stdout.write("buffered, no newline; ")
exit_process(int(sys.argv[1]))
"""


@pytest.mark.parametrize("code", [0, 3, 130])
def test_exit_process_ends_with_the_code_after_what_pythons_exit_does_first(code: int) -> None:
    """Non-daemon threads finished, an idle thread pool's workers told to end (not waited for forever),
    atexit handlers run, buffered output flushed; then the code."""
    done = subprocess.run([sys.executable, "-c", ENDING, str(code)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert (done.returncode, done.stderr) == (code, "")
    assert done.stdout == "pool worked\nbuffered, no newline; thread finished\natexit ran\n"
