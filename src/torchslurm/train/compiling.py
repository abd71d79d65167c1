"""compile=true: where torch.compile goes under each strategy, how long compiling took, and what it
needs of the machine (torch-free until it compiles: train.config checks that before any rank starts).

The model is compiled in place (as `nn.Module.compile` does), never wrapped: its state_dict keys, and so every
checkpoint, are the same with compile on or off, and a run may resume across the two. One process
compiles the whole model (training and evaluation); DDP its wrapper, so that Dynamo's DDP optimizer
splits the graph at the gradient buckets and the all-reduces still overlap backward; FSDP2 each
sharded unit after `fully_shard` (train.fsdp.shard_model), the way per-block compilation is done for
large transformers, leaving the root's all-gathers to FSDP's hooks."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torchslurm.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

_CXX = ("g++", "c++", "clang++")


def compile_in_place(module: nn.Module) -> None:
    """torch.compile `module`'s calls; the module object, its parameters and state_dict keys stay.

    What `nn.Module.compile` does, but through a function of this file: Dynamo skips frames in torch's own
    files without compiling them, so `module.compile()` on an nn.Sequential, DDP or any module of torch's
    own compiles nothing (torch.compile(module) wraps its call the same way)."""
    import torch

    call = module._call_impl

    def compiled_call(*args: Any, **kwargs: Any) -> Any:
        return call(*args, **kwargs)  # type: ignore[no-untyped-call]

    module._compiled_call_impl = torch.compile(compiled_call)  # what Module.__call__ runs when set


def compile_seconds() -> float:
    """Seconds this process has spent compiling so far (Dynamo's frames and the backward graphs); 0.0
    when this torch does not keep the account."""
    try:
        from torch._dynamo.utils import calculate_time_spent
    except ImportError:  # pragma: no cover - every torch this project supports has it
        return 0.0
    return float(calculate_time_spent().get("total_wall_time", 0.0))


def compiler_problem(device_type: str, environ: Mapping[str, str] | None = None) -> ConfigError | None:
    """What compile=true lacks on `device_type`: a C++ compiler for Inductor's CPU kernels, Triton for
    its GPU kernels; None when it has what it needs."""
    env = os.environ if environ is None else environ
    if device_type == "cuda":
        if importlib.util.find_spec("triton") is None:
            return ConfigError("compile=true on CUDA needs Triton (torch.compile writes its GPU kernels with it), "
                               "and it is not installed.", "pip install triton (the CUDA builds of torch bring it), "
                               "or set compile=false.")
        return None
    named = env.get("CXX", "")
    if named and shutil.which(named.split()[0]):
        return None
    if any(shutil.which(name) for name in _CXX):
        return None
    return ConfigError(f"compile=true on {device_type} needs a C++ compiler (torch.compile builds its CPU kernels "
                       f"with one); found none of CXX={named or '(unset)'}, {', '.join(_CXX)} on PATH.",
                       "install one (apt-get install g++, or load a gcc module), or set compile=false.")
