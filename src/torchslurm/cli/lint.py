"""`torchslurm lint SCRIPT...`: the usual multi-node mistakes in hand-written sbatch scripts. Exit 1 on errors.

A script that cannot be read (missing, a directory, not text) is reported and the others are still
linted; the exit status is then 2.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from torchslurm.errors import ConfigError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "lint", help="check hand-written sbatch scripts for the usual multi-node mistakes",
        description="Reads #SBATCH directives and srun/torchrun/python lines; reports ntasks/GPU/nproc "
        "mismatches, hard-coded MASTER_ADDR/PORT, per-rank NIC case blocks, unreachable signals and more. "
        "Exit status 1 when an error is found, 2 when a script cannot be read.")
    parser.add_argument("scripts", nargs="+", type=_script_arg, metavar="SCRIPT",
                        help="sbatch script(s); - reads the script from standard input (./- is a file named -)")
    parser.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    parser.set_defaults(handler=handle)


def _script_arg(arg: str) -> Path | None:
    """`-` is standard input (None); checked on the word itself, since Path("./-") == Path("-")."""
    return None if arg == "-" else Path(arg)


MAX_SCRIPT_BYTES = 4 << 20
"""sbatch's own limit by default (slurm.conf SchedulerParameters=max_script_size, 4 MiB)."""
_NOT_REGULAR = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _read_bytes(path: Path | None, shown: str) -> bytes:
    """At most MAX_SCRIPT_BYTES + 1 bytes of the script; a path that is not a regular file is refused before
    it is read (a FIFO would block lint, /dev/zero would fill its memory)."""
    if path is None:
        return sys.stdin.buffer.read(MAX_SCRIPT_BYTES + 1)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # opening a FIFO without O_NONBLOCK waits for a writer
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        kind = next((name for test, name in _NOT_REGULAR if test(mode)), None if stat.S_ISREG(mode) else "no file")
        if kind is not None:
            raise ConfigError(f"{shown} is {kind}, not a regular file: lint reads script files.",
                              "pass the sbatch script itself; to lint what a command writes, pipe it in: "
                              "COMMAND | torchslurm lint -.")
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read(MAX_SCRIPT_BYTES + 1)
    finally:
        os.close(fd)


def read_script(path: Path | None) -> str:
    """The text of `path` (None: standard input), or a ConfigError saying why lint cannot read it as an sbatch
    script."""
    shown = _shown(path)
    try:
        data = _read_bytes(path, shown)
    except OSError as exc:
        hint = {errno.EISDIR: f"pass the script files in it, e.g. torchslurm lint {shown}/*.sbatch",
                errno.EACCES: f"check its permissions: ls -l {shown}"}.get(
            exc.errno or 0, f"check the path (a relative path starts at {_shown(Path.cwd())})")
        raise ConfigError(f"cannot read {shown}: {exc.strerror}.", f"{hint}.") from exc
    if len(data) > MAX_SCRIPT_BYTES:
        raise ConfigError(f"{shown} is larger than {MAX_SCRIPT_BYTES >> 20} MiB, which sbatch refuses by default "
                          "(SchedulerParameters=max_script_size).", "pass the sbatch script itself; keep data out "
                          "of it (read it from a file the script names).")
    nul = data.find(b"\0")
    if nul >= 0:  # the Slurm controller refuses such scripts too
        raise ConfigError(f"{shown} is not a text file (a NUL byte at offset {nul}).",
                          "pass the sbatch script itself, e.g. torchslurm lint job.sbatch.")
    # bash and sbatch take any other bytes (a Latin-1 comment, say): lint the script, those shown as U+FFFD
    return data.decode("utf-8", errors="replace")


def _shown(path: Path | None) -> str:
    """`path` printable on any terminal (an undecodable file name keeps its bytes as \\x escapes)."""
    return "<stdin>" if path is None else os.fsencode(path).decode("utf-8", errors="backslashreplace")


def bash_syntax(text: str) -> tuple[int, str] | None:
    """bash's own verdict (`bash -n`, which reads without running): the first syntax error as (line, message),
    or None when the script parses or no bash is installed."""
    bash = shutil.which("bash")
    if bash is None:
        return None
    try:
        ran = subprocess.run([bash, "-n"], input=text.encode(), capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if ran.returncode == 0:
        return None
    err = ran.stderr.decode(errors="replace")
    m = re.search(r"line ([0-9]+): (.*)", err)
    return (int(m.group(1)), m.group(2).strip()) if m else (1, err.strip().splitlines()[-1] if err.strip() else "")


def handle(args: argparse.Namespace) -> int:
    from torchslurm.lint.report import lint

    worst = 0
    for path in args.scripts:
        try:
            text = read_script(path)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            worst = 2
            continue
        findings = lint(text, path_exists=os.path.isdir, syntax=bash_syntax)
        for f in findings:
            print(f"{_shown(path)}: {f}")
        if any(f.severity == "error" for f in findings) or (args.strict and findings):
            worst = max(worst, 1)
        if not findings:
            print(f"{_shown(path)}: ok")
    return worst
