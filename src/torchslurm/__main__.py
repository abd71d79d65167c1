"""`python -m torchslurm` is the same as the `torchslurm` command."""

import sys

from torchslurm.cli import main

sys.exit(main())
