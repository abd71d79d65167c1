"""lint checks of shell slips that bash and sbatch accept silently and the job then pays for.

`VAR= value` (bash runs `value` as a command), `# SBATCH` or an indented `#SBATCH` (sbatch skips
it: a comment), and `#SBATCH -nodes=3` (getopt reads one dash as the short option `-n` with the
value `odes=3`). Pure, nothing executed.
"""

from __future__ import annotations

from torchslurm.jobs.findings import Finding, Severity
from torchslurm.lint.registry import Context, rule

# options whose loss changes what the job gets; another ignored directive is most likely switched off on purpose
_LAYOUT = {"nodes", "ntasks", "ntasks-per-node", "gpus", "gpus-per-node", "gpus-per-task", "gres", "cpus-per-task",
           "time", "partition", "mem", "exclusive", "account", "qos"}


@rule("assign-space", "error", summary="`NCCL_DEBUG= INFO`: bash runs `INFO` as a command.")
def assign_space(c: Context) -> list[Finding]:
    return [Finding("error", "assign-space",
                    f"line {line}: `{name}= {value}` has a space after `=`: bash sets {name} to the empty string and "
                    f"runs `{value}` as a command (command not found; with `set -e` the script stops there).",
                    f"{name}={value} (no spaces around `=`).") for line, name, value in c.script.assign_space]


@rule("ignored-directive", "error", "info", summary="`# SBATCH` or an indented `#SBATCH`: sbatch skips it.")
def ignored_directive(c: Context) -> list[Finding]:
    s, out = c.script, []
    working = {key for _, key, _ in s.directive_list}
    for line, text, options in s.ignored_directives:
        lost = [key for key, _ in options if key not in working]
        important = [key for key in lost if key in _LAYOUT]
        if not lost:
            continue
        shown = text if len(text) <= 60 else text[:60] + "..."
        fixed = "#SBATCH" + text.split("SBATCH", 1)[1]
        severity: Severity = "error" if important else "info"
        out.append(Finding(severity, "ignored-directive",
                           f"line {line}: `{shown}` is not a directive: sbatch reads only lines that start with "
                           f"exactly `#SBATCH`, so {', '.join('--' + k for k in lost)} is not set"
                           + (" and the job runs with the default." if important else "."),
                           f"write it at the start of the line: {fixed} (or ##SBATCH to switch it off on purpose)."))
    return out


@rule("one-dash-option", "error", summary="`#SBATCH -nodes=3` is read as `-n odes=3`.")
def one_dash_option(c: Context) -> list[Finding]:
    out = []
    for line, word in c.script.one_dash:
        letter, rest = word[1], word[2:]
        out.append(Finding("error", "one-dash-option",
                           f"line {line}: #SBATCH {word} has one dash: sbatch reads it as the short option -{letter} "
                           f"with the value `{rest}` (`-{letter} {rest}`), not as --{word[1:].partition('=')[0]}.",
                           f"two dashes: #SBATCH -{word}."))
    return out
