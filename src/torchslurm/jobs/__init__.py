"""Jobs on a login node, without torch: a JobSpec (`spec`), how messages name its fields
(`spelling`), its findings, the rendered sbatch script (`sbatch`), the one seam that runs Slurm
commands (`slurm`) and submission (`submit`)."""
