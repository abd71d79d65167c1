"""Exit codes that launchers, rendered job scripts and ranks agree on. A leaf: imports nothing."""

PREEMPTED_EXIT_CODE = 75
"""Exit code of every rank after a stop on request (sysexits' EX_TEMPFAIL: try again later)."""

FAILED_EXIT_CODE = 1
"""A run that failed for a reason other than its settings (a checkpoint that could not be written)."""

USAGE_EXIT_CODE = 2
"""A configuration or usage error (argparse's code too)."""

INTERRUPTED_EXIT_CODE = 130
"""Exit code after Ctrl-C (SIGINT), as a shell reports a process SIGINT ended: 128 + 2."""
