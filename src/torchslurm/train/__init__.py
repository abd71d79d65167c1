"""Training: TrainConfig, the Trainer, checkpoints, exact distributed metrics, built-in data and
models, preemption (signal, agreement, requeue) and the watchdog that names a failed rank."""
