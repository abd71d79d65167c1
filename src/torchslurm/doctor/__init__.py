"""`torchslurm doctor` and `bench`: facts recorded in each rank (`probe`), judged by pure checks
(`checks`, `netcheck`, `facts`); `bench` measures collectives. Only `probe` and `bench` use torch."""
