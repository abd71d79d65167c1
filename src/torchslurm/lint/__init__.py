"""`torchslurm lint`: read an sbatch script as bash and sbatch do (`lines`, `shell`, `options`,
`parse`), know its allocation (`allocation`), and run every rule of the registry (`registry`) over it:
the directives' and batch shell's (`directives`), the launch lines' (`launch`, `launchers`), fixed
ports (`ports`) and shell slips (`slips`); `checks.lint()` is the entry. No torch."""
