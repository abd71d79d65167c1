"""Which GPU each rank would use, without torch: the device choice is a pure function of the
environment and of how many devices the rank sees (on a real GPU node torch sees exactly the
devices in CUDA_VISIBLE_DEVICES). Prints one JSON line per rank."""

import json
import os
import socket
from pathlib import Path

from torchslurm.runtime import devices
from torchslurm.runtime.distenv import detect

env = detect(os.environ)
visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
choice = devices.choose_device(os.environ, env.local_rank, env.local_world_size, len(visible))
keep = ("SLURM", "SLURMD_", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES",
        "ZE_AFFINITY_MASK", "TORCHELASTIC", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
recorded = {k: v for k, v in os.environ.items() if k.startswith(keep) and k != "SLURM_CONF"}
record = {"probe": 1, "rank": env.rank, "local_rank": env.local_rank,
                  "local_world_size": env.local_world_size, "host": socket.gethostname(),
                  "cuda_device_count": len(visible), "kind": choice.kind, "index": choice.index,
                  "reason": choice.reason, "environ": recorded}
# One file per rank: srun interleaves long stdout lines of several tasks.
job, step = os.environ.get("SLURM_JOB_ID", "local"), os.environ.get("SLURM_STEP_ID", "x")
Path(f"probe-{job}-{step}-{env.rank}.json").write_text(json.dumps(record, sort_keys=True))
print(f"probe rank={env.rank} host={record['host']} device={choice.name}", flush=True)
