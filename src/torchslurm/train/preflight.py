"""Checks of what a run needs before any rank trains: the file system (effects, so not in a config's
`__post_init__`), used by `torchslurm train` before it starts the ranks (train.config.preflight)
and by the Trainer itself before its first step, so the API gets one clear error too; and the
optimizer the Trainer is given, when it is built rather than at the first checkpoint."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from torchslurm.errors import ConfigError
from torchslurm.runtime.safefiles import open_new

__all__ = ["optimizer_problem", "run_dir_problem"]


def run_dir_problem(run_dir: Path, *, keep_created: bool = False) -> ConfigError | None:
    """run_dir must be, or become, a directory this process can write. Tried for real: permission
    bits do not tell (root passes every check, a read-only mount or /proc/... refuses anyway).
    Folders created for the test are removed again (a dry run leaves nothing behind) unless
    `keep_created`: ranks that test one shared run_dir at once must not remove it under each other."""
    run_dir = Path(run_dir)
    existing = next(p for p in (run_dir, *run_dir.parents) if p.exists())  # "/" or "." at the latest
    if not existing.is_dir():
        what = "is an existing file" if existing == run_dir else f"is inside {existing}, which is a file"
        return ConfigError(f"run_dir={run_dir} {what}; expected a directory for checkpoints/ and metrics.jsonl.",
                           "point run_dir at a directory (it is created if missing), e.g. run_dir=runs/demo.")
    created = [p for p in (run_dir, *run_dir.parents) if not p.exists()]
    probe = run_dir / f".torchslurm-write-test-{socket.gethostname()}-{os.getpid()}"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        _probe(probe)
    except OSError as exc:
        what = "cannot be created" if created else "is not writable"
        return ConfigError(f"run_dir={run_dir} {what} ({exc.strerror or exc}: {exc.filename or run_dir}); "
                           "checkpoints/ and metrics.jsonl are written there.",
                           "choose a directory you can write to, on a filesystem every node sees, e.g. "
                           "run_dir=$HOME/runs/demo.")
    finally:
        for folder in [] if keep_created else created:  # deepest first
            try:
                folder.rmdir()
            except OSError:
                break
    return None


def _probe(probe: Path) -> None:
    """Create `probe` and remove it. Never through a link planted under its (predictable) name: a
    file or link already there (left by a crash, or planted) is removed (unlink removes the link
    itself, never its target) and the file created anew, O_EXCL."""
    for attempt in (1, 2):
        try:
            with open_new(probe, "wb"):
                pass
            break
        except FileExistsError:
            if attempt == 2:
                raise
            probe.unlink()
    probe.unlink()


def optimizer_problem(model: Any, optimizer: Any) -> ConfigError | None:
    """Every parameter `optimizer` holds must be one of `model`'s (an `nn.Module` and a
    `torch.optim.Optimizer`, duck-typed): checkpoints name optimizer state after the model's
    parameters, so a foreign one would fail the first save, an epoch later (torch's get_state_dict
    raises a bare KeyError)."""
    own = {id(p) for p in model.parameters()}
    held = [p for group in optimizer.param_groups for p in group["params"]]
    foreign = [p for p in held if id(p) not in own]
    if not foreign:
        return None
    what = ("none of them is" if len(foreign) == len(held)
            else f"{len(foreign)} of them {'is' if len(foreign) == 1 else 'are'} not")
    return ConfigError(
        f"the optimizer holds {len(held)} parameter tensor(s) and {what} among the parameters of the model given to "
        f"the Trainer ({type(model).__name__}, {len(own)} parameter tensor(s)).",
        "build the optimizer from that model's parameters, e.g. torch.optim.AdamW(model.parameters()); a learnable "
        "value outside it (a loss weight) belongs in an nn.Module inside the model.")


def data_problem(train_data: Any, val_data: Any) -> ConfigError | None:
    """The Trainer's datasets must be map-style (len() and [i]: each rank reads its own share of the
    indices), `val_data` may be None (no validation), and the training data must not be empty: an
    empty one would "train" zero steps and end as if all went well."""
    for name, data in (("train_data", train_data), ("val_data", val_data)):
        if data is None and name == "val_data":
            continue
        lacks = [what for what, method in (("len()", "__len__"), ("[i]", "__getitem__")) if not hasattr(data, method)]
        if lacks:
            given = "is None" if data is None else f"({type(data).__name__}) has no {' and no '.join(lacks)}"
            return ConfigError(
                f"{name} {given}; expected a map-style Dataset (len() and [i]): each rank reads its own share of "
                "its indices.",
                "pass a torch.utils.data.Dataset with __len__ and __getitem__ (a list of samples works too); an "
                "IterableDataset has no indices to share out: keep its samples in a list, or index your files.")
    if len(train_data) == 0:
        return ConfigError(f"train_data ({type(train_data).__name__}) holds no samples; expected at least one.",
                           "check how it is built: a data path or a filter that matched nothing is the usual cause.")
    return None
