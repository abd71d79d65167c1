"""The master port: MASTER_PORT wins, a Slurm job derives one per (job, step), a local run takes a free one."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from torchslurm.errors import EnvError
from torchslurm.runtime import ports
from torchslurm.runtime.ports import (
    PORT_BASE,
    PORT_SPAN,
    RDZV_PORT_EXPR,
    STEP_SLOTS,
    derived_port,
    find_free_port,
    master_port,
    port_number,
)


def no_port() -> int:
    raise AssertionError("a fixed or derived port must not ask for a free one")


class TestDerivedPort:
    def test_out_of_ephemeral_range(self) -> None:
        ports = {derived_port(str(job), str(step)) for job in range(0, 100000, 977) for step in range(3)}
        assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN <= 32768 for p in ports)

    def test_concurrent_jobs_and_steps_never_collide(self) -> None:
        # Any window of jobs submitted close together, each with several steps.
        keys = [(job, step) for job in range(900_000, 900_000 + PORT_SPAN // STEP_SLOTS)
                for step in range(STEP_SLOTS)]
        assert len({derived_port(str(j), str(s)) for j, s in keys}) == len(keys)

    def test_ids_sharing_last_four_digits_do_not_collide(self) -> None:
        ports = [derived_port(str(prefix * 10000 + 4321), "0") for prefix in range(1, 60)]
        assert len(set(ports)) == len(ports)

    def test_batch_step_differs_from_step_zero(self) -> None:
        assert derived_port("4242", None) != derived_port("4242", "0")

    @pytest.mark.parametrize("step", [None, "", "batch", "\u0663"])  # no step id, or not one srun writes
    def test_the_batch_shell_takes_the_jobs_last_slot(self, step: str | None) -> None:
        """The batch script's own process (no step id) may hold its port while steps 0-6 run."""
        assert derived_port("4242", step) == derived_port("4242", str(STEP_SLOTS - 1))
        assert derived_port("4242", step) not in {derived_port("4242", str(s)) for s in range(STEP_SLOTS - 1)}

    @pytest.mark.parametrize("job", ["4242", "2846", "999999"])
    def test_a_jobs_ports_count_up_from_its_step_zero_port(self, job: str) -> None:
        """The batch script computes step 0's port ($port); step k of the job uses $port + k."""
        first = derived_port(job, "0")
        assert [derived_port(job, str(step)) for step in range(STEP_SLOTS)] == [first + k for k in range(STEP_SLOTS)]

    def test_a_job_id_that_is_not_a_number_is_refused_by_name(self) -> None:
        with pytest.raises(EnvError) as caught:
            derived_port("12_0", "0")
        assert (caught.value.message, caught.value.hint) == (
            "SLURM_JOB_ID='12_0' is not an integer.", "unset SLURM_JOB_ID or set it to a whole number.")

    def test_steps_past_the_slots_stay_in_their_own_jobs_ports(self) -> None:
        """Step 8 and later wrap onto the job's own slots (step id modulo STEP_SLOTS): never onto the
        ports of the jobs next to it, which may share the node."""
        own = {derived_port("4242", str(step)) for step in range(STEP_SLOTS)}
        later = {derived_port("4242", str(step)) for step in range(STEP_SLOTS, 10 * STEP_SLOTS)}
        neighbours = {derived_port(str(job), str(step)) for job in (4241, 4243) for step in range(STEP_SLOTS)}
        assert later == own and not own & neighbours
        assert derived_port("4242", str(STEP_SLOTS + 3)) == derived_port("4242", "3")


def test_the_bash_expression_is_the_derived_port_of_step_zero() -> None:
    job = 123_457
    expr = RDZV_PORT_EXPR.removeprefix("$((").removesuffix("))").replace("SLURM_JOB_ID", str(job))
    left_to_right = eval(expr)  # bash and Python both evaluate `*` and `%` left to right
    assert left_to_right == derived_port(str(job), "0")


def test_master_port_set_wins_then_the_job_then_a_free_port() -> None:
    job = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "1"}
    assert master_port({**job, "MASTER_PORT": "29500"}, no_port) == 29500
    assert master_port(job, no_port) == derived_port("4242", "1")
    assert master_port({}, lambda: 4711) == 4711


@pytest.mark.parametrize("value", ["0", "65536", "-1"])
def test_a_master_port_outside_tcp_ports_is_refused_with_the_fix(value: str) -> None:
    with pytest.raises(EnvError, match=rf"MASTER_PORT={int(value)} is not a TCP port \(1-65535\)") as info:
        port_number(value)
    assert info.value.hint == "unset MASTER_PORT to let torchslurm derive a job-unique port."


@pytest.mark.parametrize("value", ["1", "65535", " 29500"])
def test_every_tcp_port_is_a_master_port(value: str) -> None:
    assert port_number(value) == int(value)


def test_a_master_port_that_is_not_a_number_is_refused_by_name() -> None:
    with pytest.raises(EnvError) as info:
        port_number("29500a")
    assert (info.value.message, info.value.hint) == (
        "MASTER_PORT='29500a' is not an integer.", "unset MASTER_PORT or set it to a whole number.")


def test_a_free_port_is_free_on_loopback() -> None:
    port = find_free_port()
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert low <= port <= high  # the kernel picked it: not a fixed one
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))


SECRET = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"


def test_a_job_with_a_secret_takes_its_port_from_it_not_from_its_id() -> None:
    """Anyone on the node can compute a port from the job id (and bind it first); not from the secret."""
    from torchslurm.runtime.distenv import detect
    from torchslurm.runtime.ports import JOB_SECRET, secret_port, slurm_port

    job = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "1", JOB_SECRET: SECRET}
    assert master_port(job, no_port) == slurm_port(job) == secret_port(SECRET, "1") != derived_port("4242", "1")
    assert secret_port(SECRET, "1") == PORT_BASE + (0x0F1E2D3C + 1) % PORT_SPAN
    assert secret_port("ffffffff" + SECRET[8:], "0") < PORT_BASE + PORT_SPAN
    assert master_port({**job, "MASTER_PORT": "29500"}, no_port) == 29500  # a port set by hand still wins
    srun = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
            "SLURM_NODEID": "0", "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "2", "SLURM_STEP_NODELIST": "gpu07"}
    assert detect({**srun, JOB_SECRET: SECRET}).master_port == secret_port(SECRET, "0")
    assert detect(srun).master_port == derived_port("4242", "0")


@pytest.mark.parametrize("value", ["", "short", "0F1E2D3C4B5A6978", "0f1e2d3c4b5a697g"])
def test_a_job_secret_that_is_not_one_is_refused(value: str) -> None:
    from torchslurm.runtime.ports import JOB_SECRET, job_secret

    with pytest.raises(EnvError, match=r"TORCHSLURM_JOB_SECRET=.* is not a job secret: expected 16 or more "
                                       r"lower-case hex digits.*HINT: unset TORCHSLURM_JOB_SECRET"):
        job_secret({JOB_SECRET: value})


def test_a_job_secret_is_16_or_more_lower_case_hex_digits() -> None:
    assert ports.job_secret({}) is None
    assert ports.job_secret({ports.JOB_SECRET: "0123456789abcdef"}) == "0123456789abcdef"
    # a hex prefix, in either case, is not a hex digit
    for bad in ("0123456789abcde", "0123456789ABCDEF", "0123456789abcdeg", "x" * 50, "0X0123456789abcdef",
                "0x0123456789abcdef"):
        with pytest.raises(EnvError) as info:
            ports.job_secret({ports.JOB_SECRET: bad})
        assert str(info.value) == (
            f"{ports.JOB_SECRET}={bad[:40]!r} is not a job secret: expected 16 or more lower-case hex digits, as "
            f"torchslurm's job scripts make them. HINT: unset {ports.JOB_SECRET}; a script from `torchslurm submit` "
            "or `torchslurm script` sets it.")


@pytest.mark.parametrize(("step", "slot"), [("0", 0), ("3", 3), (None, STEP_SLOTS - 1), ("", STEP_SLOTS - 1),
                                            ("batch", STEP_SLOTS - 1), ("٣", STEP_SLOTS - 1)])
def test_a_secret_port_takes_the_steps_slot_and_the_batch_shell_the_last(step: str | None, slot: int) -> None:
    secret = "00000010" + "0" * 24
    assert ports.secret_port(secret, step) == ports.PORT_BASE + (16 + slot) % ports.PORT_SPAN


def test_a_port_without_a_job_id_or_secret_is_job_0s() -> None:
    assert ports.slurm_port({}) == ports.derived_port("0", None)
    secret = "00000010" + "0" * 24
    assert ports.slurm_port({ports.JOB_SECRET: secret, "SLURM_STEP_ID": "2"}) == ports.secret_port(secret, "2")
