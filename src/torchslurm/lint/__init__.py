"""`torchslurm lint`: read an sbatch script as bash and sbatch do (`parse`, `options`) and find
the classic distributed-training mistakes in it (`checks`, `launch`). No torch."""
