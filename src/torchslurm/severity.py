"""How much a finding matters, in one vocabulary for every report torchslurm makes: the job spec's
findings (`torchslurm script`/`submit`), lint's findings about a script, and the doctor's checks.

A finding is an error (it will not work), a warning (legal, but probably not what you want) or info
(worth knowing); a doctor check that found nothing wrong is ok. The doctor prints and serialises
its checks in its own established words (ok/warn/fail, `doctor/facts.py`); the meaning is this one.
"""

from __future__ import annotations

from typing import Literal

Severity = Literal["error", "warning", "info"]
"""A finding's weight: error (it will not work), warning (probably wrong), info (worth knowing)."""
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")
"""Most severe first: the order findings are reported in."""
Status = Literal["ok", "error", "warning", "info"]
"""A check's outcome: ok (nothing wrong), or the severity of what it found."""
