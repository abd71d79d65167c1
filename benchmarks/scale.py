"""Scale on the sandbox: start/stop of a 64-node sandbox, launch + init + one all_reduce at 16, 32 and
64 nodes × 1 task, and the store traffic of the Trainer's watchdog and hang detector at 64 ranks.

Every size is one sbatch job (--nodes=K --ntasks-per-node=1) whose batch script times, from its own
shell, three ways to run the same rank (benchmarks/_scale_rank.py) on the same nodes:

- bare:  `srun python _scale_rank.py bare` — init_process_group("gloo", env://) with SLURM_PROCID,
         SLURM_NTASKS and the MASTER_ADDR/MASTER_PORT the script exported: what people write by hand;
- init:  `srun python _scale_rank.py init` — torchslurm.init() (rank, port, NIC, device, the stack
         responder), then the same all_reduce;
- run:   `torchslurm run --nproc 1 _scale_rank.py init` — the launcher's srun line, then as init.

Wall time of each command (srun start to exit: process start, `import torch`, rendezvous, the
all_reduce, shutdown) in rounds whose order alternates, so load drifts hit all alike; the median per
way and its ratio to bare. Then one job of the largest size runs `_scale_rank.py traffic` (store
calls per second of the heartbeat and the hang detector, counted in every rank).

Needs root and no sandbox running (it starts its own, with no fake GPUs, and takes it down):

    python benchmarks/scale.py [--sizes 16,32,64] [--rounds 2] [--traffic-s 30]
A benchmark: it reports, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RANK = HERE / "_scale_rank.py"
WAYS = ("bare", "init", "run")


def torchslurm(*args: str, timeout_s: float = 900) -> float:
    """Run `torchslurm ARGS` (this environment's); seconds it took. Fails loudly."""
    started = time.perf_counter()
    done = subprocess.run([str(Path(sys.executable).parent / "torchslurm"), *args], capture_output=True,
                          text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise SystemExit(f"torchslurm {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return time.perf_counter() - started


def batch_script(nodes: int, rounds: int, out: Path) -> str:
    python, cli = sys.executable, Path(sys.executable).parent / "torchslurm"
    commands = {
        "bare": f"env MASTER_PORT=$((21000 + round)) srun --kill-on-bad-exit=1 python {RANK} bare",
        "init": f"srun --kill-on-bad-exit=1 python {RANK} init",
        "run": f"{cli} run --nproc 1 {RANK} init",
    }
    lines = [
        "#!/bin/bash",
        f"#SBATCH --nodes={nodes} --ntasks-per-node=1 --time=60 --output={out} --job-name=scale{nodes}",
        f'export PATH={Path(python).parent}:"$PATH" OMP_NUM_THREADS=1 TORCH_CPP_LOG_LEVEL=ERROR',
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        "timed() { local way=$1; shift; local t0=$EPOCHREALTIME;",
        '  "$@" || { echo "FAILED $way round $round"; exit 1; }',
        '  echo "RESULT $way $round $t0 $EPOCHREALTIME"; }',
        f"for round in $(seq 0 {rounds - 1}); do",
        "  if (( round % 2 )); then order='run init bare'; else order='bare init run'; fi",
        "  for way in $order; do",
        *(f'    [ "$way" = {way} ] && timed {way} {command}' for way, command in commands.items()),
        "  done",
        "done",
        "exit 0",
    ]
    return "\n".join(lines) + "\n"


def sbatch_wait(script: str, workdir: Path, env: dict[str, str], name: str) -> str:
    path = workdir / f"{name}.sbatch"
    path.write_text(script)
    done = subprocess.run(["sbatch", "--wait", str(path)], capture_output=True, text=True, env=env,
                          cwd=workdir, timeout=3600)
    output = (workdir / f"{name}.out").read_text() if (workdir / f"{name}.out").exists() else ""
    if done.returncode != 0:
        raise SystemExit(f"job {name} failed ({done.stdout}{done.stderr}):\n{output[-4000:]}")
    return output


def timings(output: str) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {way: [] for way in WAYS}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0] == "RESULT":
            found[parts[1]].append(float(parts[4]) - float(parts[3]))
    return found


def measure_traffic(nodes: int, seconds: float, work: Path, env: dict[str, str]) -> dict[str, object]:
    """Store calls of the Trainer's heartbeat and hang detector, counted in every rank of one job."""
    counted = work / "traffic.json"
    script = "\n".join([
        "#!/bin/bash",
        f"#SBATCH --nodes={nodes} --ntasks-per-node=1 --time=30 --output={work}/traffic.out",
        f'export PATH={Path(sys.executable).parent}:"$PATH" OMP_NUM_THREADS=1',
        f"srun --kill-on-bad-exit=1 python {RANK} traffic {seconds} {counted}", ""])
    sbatch_wait(script, work, env, "traffic")
    loaded: dict[str, object] = json.loads(counted.read_text())
    return loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,32,64", help="node counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per size (each runs every way once)")
    parser.add_argument("--traffic-s", type=float, default=30.0,
                        help="seconds of watchdog + hang detector at the largest size; 0: not measured")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if os.geteuid() != 0:
        raise SystemExit("the sandbox needs root: run as root")
    from torchslurm.sandbox.cluster import status

    if status().config is not None:
        raise SystemExit("a sandbox is running; this benchmark starts its own. HINT: torchslurm sandbox down")
    up_s = torchslurm("sandbox", "up", "--nodes", str(sizes[-1]), "--gpus-per-node", "0")
    print(f"sandbox of {sizes[-1]} nodes up in {up_s:.1f} s", flush=True)
    results: dict[int, dict[str, list[float]]] = {}
    traffic: dict[str, object] = {}
    try:
        env = status().environ
        work = Path(tempfile.mkdtemp(prefix="scale-"))  # kept: the jobs' logs, when one fails
        print(f"job scripts and logs in {work}", flush=True)
        os.chmod(work, 0o755)
        sbatch_wait(batch_script(sizes[0], 1, work / "warmup.out"), work, env, "warmup")  # page cache
        for nodes in sizes:
            name = f"scale{nodes}"
            results[nodes] = timings(sbatch_wait(batch_script(nodes, args.rounds, work / f"{name}.out"),
                                                 work, env, name))
            print(f"{nodes} nodes: " + ", ".join(f"{w} {statistics.median(t):.1f} s" for w, t in
                                                  results[nodes].items() if t), flush=True)
        if args.traffic_s > 0:
            traffic = measure_traffic(sizes[-1], args.traffic_s, work, env)
    finally:
        down_s = torchslurm("sandbox", "down")
    print(f"\nsandbox of {sizes[-1]} nodes: up {up_s:.1f} s, down {down_s:.1f} s")
    print("\n| nodes × 1 task | bare srun + init_process_group | srun + torchslurm.init() | torchslurm run |")
    print("|---|---|---|---|")
    for nodes, found in results.items():
        base = statistics.median(found["bare"])
        cells = [f"{base:.1f} s"] + [f"{statistics.median(found[w]):.1f} s ({statistics.median(found[w]) / base:.2f}×)"
                                     for w in ("init", "run")]
        print(f"| {nodes} | " + " | ".join(cells) + " |")
    print(f"\nstore traffic: {json.dumps(traffic)}")


if __name__ == "__main__":
    main()
