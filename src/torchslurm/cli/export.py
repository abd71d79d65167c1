"""`torchslurm export RUN_DIR OUT.pt`: a run's model weights as one plain state_dict file.

The newest checkpoint whose checksums verify (or the step-N folder named), in either layout
(`tensors.pt`, or FSDP's `shards/` read whole in this one process), without the optimizer's state:
`model.load_state_dict(torch.load("OUT.pt", weights_only=True))` takes it anywhere.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "export", help="write a run's model weights as one plain state_dict file",
        description="Write the model weights of a run's newest verified checkpoint (or of one step-N folder) as "
        "one plain state_dict file, whatever the strategy that saved them (DDP's tensors.pt or FSDP's shards). "
        "Load it with model.load_state_dict(torch.load(OUT, weights_only=True)).",
    )
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                        help="a run_dir, its checkpoints/ folder, or one step-N folder")
    parser.add_argument("out", type=Path, metavar="OUT", help="the file to write, e.g. model.pt")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from torchslurm.train.checkpoint.weights import export

    folder, step, weights = export(args.run_dir, args.out)
    size = sum(t.numel() * t.element_size() for t in weights.values())
    print(f"wrote {args.out}: {len(weights)} tensors, {size / 2**20:.1f} MiB, from {folder} (step {step})")
    print(f"load it with: model.load_state_dict(torch.load({str(args.out)!r}, weights_only=True))")
    return 0
