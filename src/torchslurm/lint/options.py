"""The option tables lint reads commands with: sbatch's and srun's (22.05.8), and torchrun's flags.

Data only: which options take no value, every long and short option sbatch knows, and the short
letters lint reads by their long names. parse.py parses with them (GNU getopt's rules), checks.py
checks `#SBATCH` options against SBATCH.
"""

from __future__ import annotations

from dataclasses import dataclass

# Short options lint reads (sbatch's and srun's letters agree), by their long names.
SHORT = {"N": "nodes", "n": "ntasks", "c": "cpus-per-task", "t": "time", "J": "job-name", "o": "output",
         "e": "error", "p": "partition", "A": "account", "G": "gpus", "w": "nodelist", "x": "exclude",
         "a": "array", "C": "constraint", "q": "qos", "K": "kill-on-bad-exit"}


@dataclass(frozen=True)
class Options:
    """Which options of a Slurm command never take the next word as their value."""

    long_flags: frozenset[str]
    """Long options with no value or an optional one (given only as `--opt=value`)."""
    short_flags: str
    """Short options with no value."""
    short_optional: str
    """Short options with an optional value, attached (`-K1`)."""
    long_names: frozenset[str] = frozenset()
    """Every long option, when known: getopt_long also takes an unambiguous prefix (`--requeu`)."""
    short_names: str = ""
    """Every short option, when known."""


# Read from sbatch and srun 22.05.8 themselves: every option of `--help`/`--usage`, plus the
# undocumented ones, given alone (`requires an argument`?) and with `=1` (`doesn't allow`?).
SBATCH = Options(frozenset({
    "contiguous", "exclusive", "get-user-env", "help", "hold", "ignore-pbs", "nice", "no-kill", "no-requeue",
    "overcommit", "oversubscribe", "parsable", "propagate", "quiet", "reboot", "requeue", "spread-job",
    "test-only", "usage", "use-min-nodes", "verbose", "version", "wait"
}), "hsvHOQVW", "k", frozenset({
    # all of sbatch 22.05.8's long options: each prefix given to `sbatch --PREFIX=1 --help` until getopt_long
    # named them (its `is ambiguous; possibilities:` list) or refused them (`unrecognized option`)
    "account", "acctg-freq", "array", "batch", "bb", "bbf", "begin", "chdir", "cluster", "cluster-constraint",
    "clusters", "comment", "constraint", "container", "context", "contiguous", "core-spec", "cores-per-socket",
    "cpu-freq", "cpus-per-gpu", "cpus-per-task", "deadline", "delay-boot", "dependency", "distribution", "error",
    "exclude", "exclusive", "export", "export-file", "extra-node-info", "get-user-env", "gid", "gpu-bind",
    "gpu-freq", "gpus", "gpus-per-node", "gpus-per-socket", "gpus-per-task", "gres", "gres-flags", "help", "hint",
    "hold", "ignore-pbs", "input", "job-name", "kill-on-invalid-dep", "licenses", "mail-type", "mail-user",
    "mcs-label", "mem", "mem-bind", "mem-per-cpu", "mem-per-gpu", "mincpus", "network", "nice", "no-kill",
    "no-requeue", "nodefile", "nodelist", "nodes", "ntasks", "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node",
    "ntasks-per-socket", "ntasks-per-tres", "open-mode", "output", "overcommit", "oversubscribe", "parsable",
    "partition", "power", "prefer", "priority", "profile", "propagate", "qos", "quiet", "reboot", "requeue",
    "reservation", "signal", "sockets-per-node", "spread-job", "switches", "tasks-per-node", "test-only",
    "thread-spec", "threads-per-core", "time", "time-min", "tmp", "uid", "usage", "use-min-nodes", "verbose",
    "version", "wait", "wait-all-nodes", "wckey", "wrap",
}), "abcdehikmnopqstvwxABCDFGHJLMNOQSVW")
SRUN = Options(frozenset({
    "bcast", "compress", "contiguous", "debugger-test", "disable-status", "exact", "exclusive", "help", "hold",
    "immediate", "interactive", "kill-on-bad-exit", "label", "multi-prog", "nice", "no-allocate", "no-kill",
    "overcommit", "overlap", "oversubscribe", "preserve-env", "propagate", "pty", "quiet", "quit-on-interrupt",
    "reboot", "resv-ports", "send-libs", "spread-job", "test-only", "unbuffered", "usage", "use-min-nodes",
    "verbose", "version", "whole", "x11"
}), "hlsuvEHOQVXZ", "kIK")


# torchrun's (and torch.distributed.launch's) options that take no value; every other one takes one
LAUNCHER_FLAGS = {"standalone", "module", "no-python", "run-path", "virtual-local-rank", "use-env", "help", "m", "h"}

# deepspeed's and accelerate launch's options that take no value (their argparse `store_true` ones)
DEEPSPEED_FLAGS = frozenset({"no-ssh", "no-ssh-check", "no-local-rank", "no-python", "module", "force-multi",
                             "elastic-training", "bind-cores-to-rank", "enable-each-rank-log", "save-pid", "m"})
ACCELERATE_FLAGS = frozenset({"multi-gpu", "cpu", "tpu", "use-deepspeed", "use-fsdp", "use-megatron-lm", "use-xpu",
                              "same-network", "debug", "quiet", "q", "m", "module", "no-python", "h", "help",
                              "enable-cpu-affinity", "downcast-bf16", "tpu-use-cluster", "fsdp-use-orig-params"})


# ---- reading options as GNU getopt_long does (sbatch and srun use it) ----------------------------
def parse_options(args: list[str], table: Options, stop_at_operand: bool) -> tuple[list[tuple[str, str]], list[str]]:
    """(option, value) pairs, long names where lint knows them, and the words left after the options.

    `stop_at_operand`: srun ends its options at the command; `#SBATCH` lines have no operands.
    A value-less option gets "" (so `-K` and `--kill-on-bad-exit` read as given).
    """
    found: list[tuple[str, str]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or arg == "-" or not arg.startswith("-"):  # getopt stops at `--`
            if stop_at_operand or arg == "--":
                return found, args[i + (arg == "--"):] if stop_at_operand else []
        elif arg.startswith("--"):
            key, eq, value = arg[2:].partition("=")
            key = _full_name(key, table)
            if not eq and key not in table.long_flags and i + 1 < len(args):
                value, i = args[i + 1], i + 1
            found.append((key, value))
        else:
            i = _short_options(args, i, table, found)
        i += 1
    return found, []


def long_matches(key: str, table: Options) -> list[str]:
    """The long options `--key` names as getopt_long reads it: itself, or those it is a prefix of."""
    if key in table.long_names:
        return [key]
    return sorted(name for name in table.long_names if name.startswith(key))


def _full_name(key: str, table: Options) -> str:
    """`requeu` -> `requeue` (an unambiguous prefix); an unknown or ambiguous name as given."""
    matches = long_matches(key, table) if key else []
    return matches[0] if len(matches) == 1 else key


def _short_options(args: list[str], i: int, table: Options, found: list[tuple[str, str]]) -> int:
    """`-lK1`, `-N2`, `-N 2`: flags may be grouped; a value is the rest of the word or the next word."""
    word = args[i]
    for j, letter in enumerate(word[1:], start=1):
        key = SHORT.get(letter, letter)
        if letter in table.short_flags:
            found.append((key, ""))
            continue
        value = word[j + 1:]
        if letter not in table.short_optional and not value and i + 1 < len(args):
            value, i = args[i + 1], i + 1
        found.append((key, value))
        return i
    return i
