"""torchslurm.doctor.bench, the pure parts: sizes, nccl-tests' bandwidth formulas, config checks, the table."""

from __future__ import annotations

import pytest

from torchslurm.doctor import bench
from torchslurm.errors import ConfigError


def test_parse_and_format_sizes() -> None:
    assert bench.parse_sizes("1K, 64KiB,1M,2g,100,8B") == (1024, 65536, 1 << 20, 2 << 30, 100, 8)
    assert [bench.format_size(s) for s in (1024, 1536, 1 << 20, 3 << 30)] == ["1K", "1536", "1M", "3G"]
    for bad in ("", "1X", "-1K", "0"):
        with pytest.raises(ConfigError, match="HINT: "):
            bench.parse_sizes(bad)


def test_nccl_tests_bus_bandwidth_factors() -> None:
    assert bench.bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bench.bus_factor("all_gather", 4) == pytest.approx(3 / 4)
    assert bench.bus_factor("broadcast", 16) == 1.0
    assert bench.bus_factor("all_reduce", 1) == 0.0
    algbw, busbw = bench.bandwidth("all_reduce", 1_000_000_000, 0.5, 4)
    assert (algbw, busbw) == pytest.approx((2.0, 3.0))
    with pytest.raises(ConfigError, match="op='reduce'"):
        bench.bus_factor("reduce", 2)


def test_all_gather_buffers_hold_one_share_of_the_size() -> None:
    assert bench.elements_per_rank("all_gather", 1 << 20, 4) == (1 << 20) // 16
    assert bench.elements_per_rank("all_reduce", 1 << 20, 4) == (1 << 20) // 4
    assert bench.elements_per_rank("broadcast", 2, 4) == 1


def test_bench_config_validation_names_the_flag() -> None:
    assert bench.BenchConfig().sizes == bench.parse_sizes(bench.DEFAULT_SIZES)
    for kw, flag in (({"ops": ("all_to_all",)}, "--ops"), ({"iters": 0}, "--iters=0"),
                     ({"warmup": -1}, "--warmup=-1"), ({"backend": "mpi"}, "--backend='mpi'")):
        with pytest.raises(ConfigError, match=f"{flag}.*HINT: "):
            bench.BenchConfig(**kw)


def test_table_has_a_row_per_result_and_each_ops_peak() -> None:
    rows = [bench.BenchResult("all_reduce", 1024, 2, 5, 10.0, 0.1, 0.1),
            bench.BenchResult("all_reduce", 1 << 20, 2, 5, 100.0, 10.5, 10.5),
            bench.BenchResult("broadcast", 1024, 2, 5, 5.0, 0.2, 0.2)]
    text = bench.render_table(rows, header="hdr")
    lines = text.splitlines()
    assert lines[0] == "hdr" and len(lines) == 2 + 3 + 2
    assert "peak all_reduce busbw: 10.5 GB/s at 1M" in text
    assert "peak broadcast busbw: 0.2 GB/s at 1K" in text


def test_unknown_backend_lists_the_choices_and_the_default() -> None:
    with pytest.raises(ConfigError) as info:
        bench.BenchConfig(backend="mpi")
    assert info.value.message == "--backend='mpi' is not one of gloo, nccl."
    assert info.value.hint == "choose gloo or nccl, or leave it unset (NCCL on GPUs, Gloo on CPUs)."
