"""`torchslurm sandbox`: a real Slurm cluster on one machine, nodes in network namespaces
(`config` renders it, `cluster` starts and stops the daemons). No torch."""
