# The two commands a new user needs: `make demo` and `make test`.
# Both create .venv and install what they need on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
SLURM_PACKAGES := slurmctld slurmd slurm-client munge

.PHONY: demo test docs slurm-packages clean mutants gpu-check

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first and pinned: this exact version is a CPU wheel on local disk; an unpinned
	# torch would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[train,dev,docs]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/torchslurm train --nproc 2 resume=never

# The docs site (docs/, mkdocs.yml) at http://127.0.0.1:8000, rebuilt on every edit.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# Cluster tests need root (network namespaces, slurmd); as root, install Debian's Slurm first.
slurm-packages:
	@if [ "$$(id -u)" = 0 ] && ! command -v slurmd >/dev/null 2>&1; then \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(SLURM_PACKAGES); \
	fi

test: $(STAMP) slurm-packages
	$(BIN)/ruff check src tests examples benchmarks tools
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir $(VENV)/site
	# the cluster tests beside the others (they mostly wait for Slurm), then the few marked `alone` beside
	# the unit tests and mypy (tools/run_tests.py)
	$(BIN)/python tools/run_tests.py

# What must hold on a GPU, in one go (under 8 minutes on one GPU; the CPU runs a reduced form in `make test`):
# doctor, NCCL bench, fp16 resume, ddp<->fsdp resume, fsdp bf16 + async checkpoints preempted, compile=true,
# tokens/s against a hand loop. Results in gpu-check.json and a table (docs/benchmarks.md#the-gpu-check).
gpu-check: $(STAMP)
	$(BIN)/python benchmarks/gpu_check.py --json gpu-check.json

# Mutation testing of the core, one shard at a time (not part of `make test`; docs/testing.md):
# `make mutants SHARD=hostlist`; `make mutants` lists the shards.
mutants: $(STAMP)
	$(BIN)/python tools/mutants.py $(SHARD)

clean:
	rm -rf $(VENV) build *.egg-info mutants
