"""`torchslurm lint`: read an sbatch script as bash and sbatch do (`lines`, `shell`, `options`, `parse`),
derive its allocation (`allocation`), and run every rule of the registry on it (`report`, `registry`).
A rule is declared once with `@rule` (`rule`) in the module of its topic: `directives`, `launch`,
`rendezvous`, `launchers`, `ports`, `batch`, `slips`, `machine`. No torch."""
