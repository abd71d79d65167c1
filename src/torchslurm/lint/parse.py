"""lint.parse(text) -> Script: what a hand-written sbatch script asks for and runs. Pure, nothing executed.

The text is split into logical lines by lines.py and options are read by options.py. Reads the
`#SBATCH` directives with sbatch's own tokenizer and option table, and the commands with bash's quoting
(single and double quotes, backslash escapes, `#` comments, line continuations), so a `;`, `&&` or
continuation inside `srun bash -c "..."` stays part of the quoted string, and the commands inside it
run under that srun, with its options; heredoc bodies are data, and `$'...'` is a quote with
backslash escapes. Options follow GNU getopt as sbatch and srun use it: an option that takes a value
takes the next word whatever it looks like (`--nodes -1`), one that takes none never does, and a
long option may be shortened to any unambiguous prefix (`--requeu`). What a command runs (wrappers,
launchers, python) is programs.py's. Arrays (`ARGS=(...)`) are followed into `"${ARGS[@]}"`.
"""

from __future__ import annotations

import re
from collections import ChainMap
from collections.abc import MutableMapping
from dataclasses import dataclass, field, replace

from torchslurm.jobs.sbatch import sbatch_split
from torchslurm.lint.lines import Unclosed, commands_ending, read_lines
from torchslurm.lint.options import SBATCH, SRUN, parse_options
from torchslurm.lint.programs import launcher_args, procs_per_node, program_name, started, unwrap
from torchslurm.lint.shell import (
    ASSIGN_RE,
    MAX_NESTING,
    MAX_VALUE,
    NAME_RE,
    PER_TASK_VARS,
    batch_marker,
    expand,
    expand_joined,
    raw_words,
)
from torchslurm.runtime.variables import is_digits

# shell words that may come before a command on one line (`if ...; then srun ...`)
MAX_WRAPPERS = 8
"""How many wrappers, `bash -c` and `eval` lint sees through in one command."""
_PREFIX_WORDS = {"then", "do", "else", "if", "elif", "while", "until", "!", "{", "(", "time", "exec", "}", ")"}


TORCHRUN_LIKE = frozenset({"torchrun", "torch.distributed.launch", "multiproc"})
"""Launchers with torchrun's rendezvous options (--nnodes, --node-rank, --master-addr): NVIDIA's multiproc.py is a
copy of torch.distributed.launch."""


@dataclass
class Launch:
    """One line that starts training: under srun or not, through a launcher or plain python."""

    line: int
    under_srun: bool
    srun_opts: dict[str, str]
    launcher: str | None
    """"torchrun", "torch.distributed.launch", "deepspeed", "accelerate", "colossalai" (`colossalai run`), "deepy"
    (gpt-neox's deepy.py), "multiproc" (NVIDIA's), or None: plain python (`python train.py`, `python -m pkg`)."""
    nproc_per_node: int | None
    python: str
    rdzv_endpoint: str | None = None
    signals_to_handle: str | None = None
    ignored: list[str] = field(default_factory=list)
    """Signals the launcher ignores (`trap "" SIG` before `exec`)."""
    launcher_opts: dict[str, str] = field(default_factory=dict)
    """The launcher's options before the training script, `-` spelling (`nnodes`, `master-addr`); flags as ""."""
    per_task: bool = False
    """Each task's shell expands the `$VARS` of this line (`srun bash -c '...'`), not the batch shell once."""
    words: list[str] = field(default_factory=list)
    """The whole command as the shell hands it over (srun's options too), `$VARS` expanded where known
    (a per-task variable expanded by the batch shell is a `shell.batch_marker`)."""
    background: bool = False
    """Started with `&`: the script goes on while it runs (another step may overlap it)."""
    env: set[str] = field(default_factory=set)
    """Variables set for this command alone (`SRUN_CPUS_PER_TASK=8 srun ...`)."""

    @property
    def reaches_other_nodes(self) -> bool:
        """The launcher starts the ranks of other nodes itself, over ssh/pdsh from a hostfile: deepspeed and
        gpt-neox's deepy.py (their default hostfile is /job/hostfile), `colossalai run --hostfile`."""
        if self.launcher == "colossalai":
            return "hostfile" in self.launcher_opts
        return self.launcher in ("deepspeed", "deepy")


@dataclass(frozen=True)
class Command:
    """One simple command as the shell reads it, before any expansion."""

    line: int
    text: str
    """As written (`trap 'kill 0' USR1`)."""
    words: list[str]
    """Its words, quotes kept, without redirections and leading keywords (`then`, `exec`, ...)."""
    per_task: bool
    """Run by each task's shell (`srun bash -c '...'`), not the batch shell."""


@dataclass
class Script:
    """What lint needs to know about a script."""

    directives: dict[str, str] = field(default_factory=dict)
    """The `#SBATCH` options sbatch reads, by long name: the last value given."""
    directive_list: list[tuple[int, str, str]] = field(default_factory=list)
    """Every (line, option, value) of those, in order: sbatch checks each one."""
    exports: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Variables set in the batch shell: (line, value as expanded)."""
    task_exports: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Variables set inside each task (`srun bash -c '...'`)."""
    exported: set[str] = field(default_factory=set)
    """Names the batch shell exports (so srun's tasks inherit them)."""
    launches: list[Launch] = field(default_factory=list)
    text: str = ""
    """The script as given."""
    bodies: list[list[tuple[int, str]]] = field(default_factory=list)
    """Each piece of shell code read, as logical lines (script line, text as written): [0] is the script
    itself, then the code of each `bash -c` and `eval`, in the order read (heredoc bodies are data: absent)."""
    first_command: int | None = None
    """The script's line of its first command: sbatch reads `#SBATCH` lines only above it."""
    commands: list[Command] = field(default_factory=list)
    """Every simple command, in every piece of shell code, in the order read."""
    read: list[tuple[int, int]] = field(default_factory=list)
    """The script's physical lines (first, last) that lint read, as commands or as heredoc text."""
    unclosed: list[Unclosed] = field(default_factory=list)
    """What runs to the end of a piece of shell code, by script line: a quote or expansion lint cannot see
    close (nothing after it was read), or a heredoc with no delimiter line."""


@dataclass
class _Shell:
    """The shell that runs some text: the batch shell, or each task's shell under srun."""

    vars: MutableMapping[str, str | None]
    """Variables set by this shell or inherited: their values, expanded (None: set to what lint cannot know)."""
    srun: dict[str, str] | None = None
    """The options of the srun whose tasks run this shell (`srun bash -c CODE`); None: the batch shell's own."""
    srun_words: list[str] = field(default_factory=list)
    """That srun and its options, as written."""
    arrays: MutableMapping[str, list[str] | None] = field(default_factory=dict)
    """Arrays set by `NAME=(...)`: their elements, expanded (None: lint cannot know them)."""
    counts: dict[str, str] = field(default_factory=dict)
    """Slurm's counts fixed by the `#SBATCH` lines (SLURM_NNODES), for `$(( ))` only."""

    @property
    def per_task(self) -> bool:
        """Run by each task under srun, not the batch shell."""
        return self.srun is not None

    def lookup(self, name: str, arithmetic: bool) -> str | None:
        if name in self.vars:
            return self.vars[name]
        if arithmetic and name in self.counts:
            return self.counts[name]
        return batch_marker(name) if name in PER_TASK_VARS and not self.per_task else None

    def child(self, srun: dict[str, str] | None, srun_words: list[str]) -> _Shell:
        """`bash -c CODE` run under `srun`: the srun of its own line, else the one this shell runs under (None:
        neither, the batch shell runs it). Variables are inherited: a view of this shell's, not a copy, so that a
        script of many variables and many `bash -c` lines takes linear time, and what CODE sets stays in CODE."""
        return _Shell(ChainMap({}, self.vars), srun, srun_words, ChainMap({}, self.arrays), self.counts)

    def expand(self, word: str) -> list[str]:
        """The fields `word` becomes in this shell."""
        return expand(word, self.lookup, arrays=self.arrays)


def parse(text: str) -> Script:
    script = Script(text=text)
    _parse_body(text, script, first_line=1, shell=_Shell({}))
    return script


def _parse_body(text: str, script: Script, first_line: int, shell: _Shell, level: int = 0) -> None:
    """`shell`: the shell that runs this text (the batch shell, or each task's under `srun bash -c`); `level`: how
    deep this code sits in other code (`eval`, `bash -c`), read down to MAX_NESTING; 0: the script itself, whose
    `#SBATCH` lines above its first command sbatch reads."""
    if level > MAX_NESTING:
        script.unclosed.append(Unclosed(first_line, "bash -c", heredoc=False, nested=True))
        return
    body: list[tuple[int, str]] = []
    script.bodies.append(body)
    lines = read_lines(text)
    if level == 0:
        script.read = lines.spans
    if lines.unclosed is not None:
        script.unclosed.append(replace(lines.unclosed, line=lines.unclosed.line + first_line - 1))
    for number, line in lines.logical:
        number += first_line - 1
        body.append((number, line))
        stripped = line.strip()
        header = level == 0 and script.first_command is None
        if line.startswith("#SBATCH") and header:  # sbatch matches the line's first bytes: no blanks before
            for key, value in parse_options(sbatch_split(line[len("#SBATCH"):]), SBATCH, False)[0]:
                script.directives[key] = value
                script.directive_list.append((number, key, value))
        if not stripped or stripped.startswith("#"):
            continue
        if header:
            shell.counts.update(_slurm_counts(script.directives))
            script.first_command = number  # sbatch stops reading directives at the first command
        for part, background in commands_ending(stripped):
            _parse_command(number, part, script, shell, background, level)


def _slurm_counts(d: dict[str, str]) -> dict[str, str]:
    """The job's counts as Slurm will set them, where the directives fix them."""
    counts = {}
    for option, names in (("nodes", ("SLURM_NNODES", "SLURM_JOB_NUM_NODES")), ("ntasks", ("SLURM_NTASKS",)),
                          ("ntasks-per-node", ("SLURM_NTASKS_PER_NODE",))):
        if is_digits(d.get(option, "")):
            counts.update(dict.fromkeys(names, d[option]))
    return counts


_REDIRECT_RE = re.compile(r"([0-9]*|&)(>>?|<<?<?|>&|<&|>\|)(.*)", re.DOTALL)
DECLARE = frozenset({"export", "declare", "local", "readonly", "typeset"})
"""Builtins whose arguments are assignments."""


def _without_redirections(words: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(words):
        m = _REDIRECT_RE.match(words[i])
        if m:
            i += 1 if m.group(3) else 2  # `>log` / `2>&1`, or `> log`
            continue
        out.append(words[i])
        i += 1
    return out


_PLAIN_COMMAND = re.compile(r"[^\\'\"`$#<>=]*")
"""A command with no quote, expansion, comment, redirection or assignment: its words are as written."""
_BLANKS = re.compile(r"[ \t\n]+")


def _parse_command(number: int, part: str, script: Script, shell: _Shell, background: bool, level: int) -> None:
    plain = _PLAIN_COMMAND.fullmatch(part) is not None  # most commands of a long script: a fast path
    raw = [w for w in _BLANKS.split(part) if w] if plain else _without_redirections(raw_words(part))
    while raw and raw[0] in _PREFIX_WORDS:  # `then srun ...`, `exec python ...`
        raw = raw[1:]
    script.commands.append(Command(number, part, raw, shell.per_task))
    if raw and raw[0] in DECLARE:  # `export A B=1`, `declare -x` (also `-rx`, `typeset -x`, `local -x`)
        exporting = raw[0] == "export" or any(w.startswith("-") and "x" in w for w in raw[1:])
        for word in raw[1:]:
            name = _assign(number, word, script, shell) if ASSIGN_RE.match(word) else word
            if exporting and NAME_RE.fullmatch(name):
                script.exported.add(name)
        return
    assigned = set()
    while raw and ASSIGN_RE.match(raw[0]):  # `X=1`, `NCCL_DEBUG=INFO srun ...`
        assigned.add(_assign(number, raw[0], script, shell))
        raw = raw[1:]
    words = raw if plain else [f for w in raw for f in shell.expand(w)]
    launch = _parse_launch(number, words, script, shell, background, level)
    if launch is not None:
        launch.env = assigned
        script.launches.append(launch)


def _assign(number: int, word: str, script: Script, shell: _Shell) -> str:
    """`NAME=value`, `NAME+=value`, `NAME=(...)` or `NAME+=(...)` done in `shell` and recorded: its name."""
    name, value = _value(word, shell)
    shell.vars[name] = value  # however long: a word that reads more than MAX_VALUE characters stays as written
    shown = word.split("=", 1)[1] if value is None else value
    (script.exports if not shell.per_task else script.task_exports)[name] = (number, shown[:MAX_VALUE])
    return name


def _value(word: str, shell: _Shell) -> tuple[str, str | None]:
    """The name an assignment sets and the value `$NAME` has after it (an array's first element), None for an
    array lint cannot know."""
    name, value = word.split("=", 1)
    append, name = name.endswith("+"), name.rstrip("+")
    if value.startswith("(") and value.endswith(")"):  # an array: `ARGS=(--nnodes 2)`, `ARGS+=(...)`
        before = shell.arrays.get(name, []) if append else []
        elements = None if before is None else before + [f for w in raw_words(value[1:-1]) for f in shell.expand(w)]
        shell.arrays[name] = elements if elements is None or len(elements) <= MAX_VALUE else None
        known = shell.arrays[name]
        return name, None if known is None else known[0] if known else ""
    value = expand_joined(value, shell.lookup, shell.arrays)
    if append:  # `PATH+=:/opt/bin`: after the value the variable had (one lint cannot know stays `${NAME}`)
        old = shell.vars.get(name)
        value = (f"${{{name}}}" if old is None else old) + value
    return name, value


def _shell_code(words: list[str]) -> tuple[str, list[str]] | None:
    """`bash -c CODE ARGS...` (also `sh`, `bash -lc`, `bash -l -c`): the code and its arguments."""
    if program_name(words[0]) not in ("bash", "sh", "zsh", "dash"):
        return None
    i = 1
    while i < len(words) and words[i].startswith("-"):
        if "c" in words[i] and not words[i].startswith("--") and i + 1 < len(words):
            return words[i + 1], words[i + 2:]
        i += 1
    return None


def _parse_launch(number: int, words: list[str], script: Script, shell: _Shell, background: bool,
                  level: int) -> Launch | None:
    """The launch these words start, if any; a wrapped `bash -c CODE` or `eval` is read as its code. Wrappers are
    seen through MAX_WRAPPERS deep (`srun env ... numactl ... python`): a line of thousands costs linear time."""
    srun, srun_words, ignored, wrappers = shell.srun, shell.srun_words, [], []
    if words and program_name(words[0]) == "srun":
        pairs, rest = parse_options(words[1:], SRUN, True)
        srun_words, words = words[:len(words) - len(rest)], rest
        srun = dict(pairs)  # a later option wins, as with getopt
    for _ in range(MAX_WRAPPERS):
        if not words:
            break
        inner = unwrap(words)
        if inner is not None:
            wrappers += words[:len(words) - len(inner)]  # kept in the launch's words (`apptainer exec --nv IMG`)
            words = inner
            continue
        if words[0] == "eval":  # a builtin: the shell that reads the line runs its code (srun cannot run it)
            _parse_body(" ".join(words[1:]), script, number, shell, level=level + 1)
            return None
        code = _shell_code(words)
        if code is None:
            break
        if "$@" not in code[0]:
            # `srun bash -c CODE`: each task's shell runs CODE, with this srun's options
            _parse_body(code[0], script, number, shell.child(srun, [*srun_words, *wrappers]), level=level + 1)
            return None
        # `bash -c 'trap "" SIG; exec "$@"' NAME cmd...`: the command is the rest, signals ignored
        ignored = re.findall(r'trap\s+(?:""|\'\')\s+([A-Z0-9 ]+)', code[0])
        words = code[1][1:]
    if not words:
        return None
    program = started(words)
    if program is None:
        return None
    launcher, rest = program
    opts_map = launcher_args(launcher, rest)
    nproc = procs_per_node(launcher, opts_map)
    return Launch(number, srun is not None, srun or {}, launcher, nproc,
                  python=words[0], rdzv_endpoint=opts_map.get("rdzv-endpoint"),
                  signals_to_handle=opts_map.get("signals-to-handle"), ignored=" ".join(ignored).split(),
                  launcher_opts=opts_map, per_task=shell.per_task, words=[*srun_words, *wrappers, *words],
                  background=background)
