"""Exit codes that launchers, rendered job scripts and ranks agree on. A leaf: imports nothing."""

PREEMPTED_EXIT_CODE = 75
"""Exit code of every rank after a stop on request (sysexits' EX_TEMPFAIL: try again later)."""

USAGE_EXIT_CODE = 2
"""A configuration or usage error (argparse's code too)."""

INTERRUPTED_EXIT_CODE = 130
"""Exit code after Ctrl-C (SIGINT), as a shell reports a process SIGINT ended: 128 + 2."""
