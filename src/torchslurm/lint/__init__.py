"""`torchslurm lint`: read an sbatch script as bash and sbatch do (`lines`, `shell`, `options`,
`parse`) and find the classic distributed-training mistakes in it (`checks` for directives,
`launch` and `launchers` for the lines that start training, `ports`, `slips`). No torch."""
