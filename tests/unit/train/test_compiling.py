"""compile=true: compiled in place (the same module, the same state_dict keys, really compiled), its
seconds counted, and a machine without a compiler refused with what to do."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchslurm.train.compiling import compile_in_place, compile_seconds, compiler_problem
from torchslurm.train.config import TrainConfig, device_problem


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(x)
        return out


@pytest.mark.parametrize("make", [Net, lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))],
                         ids=["own module", "torch's own Sequential"])
def test_compiled_in_place_keeps_the_module_and_its_keys_and_compiles(make: type[nn.Module]) -> None:
    import torch._dynamo

    torch.manual_seed(0)
    model = make()
    keys, eager = list(model.state_dict()), model(torch.ones(3, 4))
    torch._dynamo.reset()
    before = compile_seconds()
    compile_in_place(model)
    out = model(torch.ones(3, 4))
    out.sum().backward()
    assert list(model.state_dict()) == keys  # no _orig_mod. prefix: checkpoints are the same
    assert torch.allclose(out, eager)
    assert compile_seconds() > before  # torch.compile really ran (Module.compile() skips torch's own modules)
    assert all(p.grad is not None for p in model.parameters())


def test_a_missing_cpu_compiler_is_refused_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    problem = compiler_problem("cpu", {"CXX": "my-g++"})
    assert problem is not None
    assert "compile=true on cpu needs a C++ compiler" in str(problem) and "CXX=my-g++" in str(problem)
    assert "compile=false" in problem.hint
    assert compiler_problem("cpu", {}) is not None


def test_a_compiler_on_path_or_named_by_cxx_is_enough(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    import os
    from pathlib import Path

    folder = Path(str(tmp_path))
    cxx = folder / "clang++"
    cxx.write_text("#!/bin/sh\n")
    cxx.chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))
    assert compiler_problem("cpu", {}) is None
    assert compiler_problem("cpu", {"CXX": f"{cxx} -O2"}) is None
    monkeypatch.setenv("PATH", os.defpath)


def test_triton_is_what_cuda_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    problem = compiler_problem("cuda", {})
    assert problem is not None and "needs Triton" in str(problem)


def test_device_problem_asks_for_the_compiler_only_with_compile_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CXX", raising=False)
    assert device_problem(TrainConfig(), "cpu") is None
    problem = device_problem(TrainConfig(compile=True), "cpu")
    assert problem is not None and "C++ compiler" in str(problem)
    fp16 = device_problem(TrainConfig(compile=True, amp="fp16"), "cpu")  # the fp16 rule is said first
    assert fp16 is not None and "amp=fp16 needs CUDA" in str(fp16)
