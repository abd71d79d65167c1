"""Configuration of a training run, torch-free so a login node can validate it.

TrainConfig belongs to the Trainer's loop; ExampleConfig picks the data and model of the
built-in examples. Both load from one flat YAML/TOML file plus `key=value` overrides, where each
key is spelled exactly like the dataclass field.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

import yaml

from torchslurm.configfile import load_yaml, read_mapping, unknown_keys_error
from torchslurm.errors import ConfigError, below_minimum, not_one_of, shown
from torchslurm.train.checkpoint.layout import CHECKPOINTS, MARKER, STATE_FILE, folder_of, step_dir
from torchslurm.train.compiling import compiler_problem
from torchslurm.train.preflight import run_dir_problem
from torchslurm.train.trackers import installed_problem, mlflow_uri_problem, project_problem, trackers_problem

LR_SCALINGS = ("none", "linear", "sqrt")
AMP_MODES = ("off", "bf16", "fp16")
STRATEGIES = ("ddp", "fsdp")
HANG_ACTIONS = ("exit", "wait", "off")


_C = TypeVar("_C")


def _known_keywords(cls: type[_C]) -> type[_C]:
    """A dataclass whose constructor answers an unknown keyword (TrainConfig(epoch=2)) as the CLI and
    config files do, with the closest field, instead of a bare TypeError."""
    init = cls.__init__

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> None:
        valid = [f.name for f in fields(cls)]  # type: ignore[arg-type]
        if unknown := sorted(set(kwargs) - set(valid)):
            raise unknown_keys_error(f"{cls.__name__}(...)", unknown, valid)
        init(self, *args, **kwargs)

    setattr(cls, "__init__", checked)  # noqa: B010 (a method assigned on a class)
    return cls


@_known_keywords
@dataclass(frozen=True)
class TrainConfig:
    """Everything the Trainer's loop needs; each field is also a `key=value` of `torchslurm train`."""

    epochs: int = 5
    """Passes over the training data."""
    batch_size: int = 64
    """Samples per rank per micro-step (the per-GPU batch size of a classic DDP script)."""
    lr: float = 0.01
    """Learning rate before lr_scaling; it overrides the optimizer's own lr."""
    lr_scaling: str = "none"
    """How lr grows with the world size: none | linear (lr·W) | sqrt (lr·√W)."""
    grad_accum_steps: int = 1
    """Micro-steps per optimizer step; DDP all-reduces only on the last one."""
    amp: str = "off"
    """Mixed precision: off | bf16 (autocast; CPU or GPU) | fp16 (autocast + GradScaler; CUDA only)."""
    grad_clip: float = 0.0
    """Clip the global gradient norm to this value; 0 disables clipping."""
    num_workers: int = 0
    """DataLoader worker processes per rank."""
    pin_memory: bool = True
    """Pin host memory for faster copies (used only on CUDA)."""
    seed: int = 0
    """Seeds data order, dropout and every RNG; same seed and world size → same losses."""
    deterministic: bool = False
    """torch's deterministic algorithms: bitwise-repeatable runs and resumes on a GPU and with compile=true too
    (some kernels are slower)."""
    run_dir: Path = Path("runs/latest")
    """Where checkpoints/, metrics.jsonl and curves.png go (shared by all nodes)."""
    checkpoint_every_epochs: int = 1
    """Checkpoint after every N-th epoch (0: only after the last epoch)."""
    checkpoint_every_steps: int = 0
    """Also checkpoint every N optimizer steps, mid-epoch (0: off)."""
    keep_last: int = 2
    """Complete checkpoints kept; older ones are deleted (at least 1)."""
    resume: str = "auto"
    """auto (newest complete checkpoint in run_dir, if any) | never | a checkpoint folder (a step-N directory)."""
    log_every: int = 50
    """Optimizer steps between progress lines and metrics.jsonl step records (0: off)."""
    strategy: str = "ddp"
    """ddp (every rank holds the whole model) | fsdp (FSDP2: parameters, gradients and optimizer state sharded)."""
    fsdp_wrap: str = ""
    """fsdp: comma-separated module class names sharded as units (e.g. Block); empty: every child holding
    at least 10% of the parameters."""
    fsdp_reshard_after_forward: bool = True
    """fsdp: free gathered parameters after each unit's forward (less memory, one more all-gather in backward)."""
    activation_checkpointing: bool = False
    """fsdp: recompute each sharded unit's activations in backward instead of keeping them."""
    compile: bool = False
    """torch.compile the model (in place: checkpoints are the same either way): whole under DDP or one process,
    each sharded unit under fsdp. The progress lines show compile time apart from step time."""
    checkpoint_async: bool = False
    """Write checkpoints in the background (staged to CPU memory first); training goes on meanwhile."""
    straggler_every: int = 50
    """Optimizer steps between gathers of every rank's compute/wait split, for straggler detection (0: off)."""
    straggler_window: int = 5
    """Gathers a straggler verdict looks at: a rank is named once more than half of them saw it slow."""
    straggler_threshold: float = 1.3
    """A rank whose compute time per step is this many times the median of the others' is a straggler."""
    hang_timeout_s: float = 0.0
    """Seconds without any rank finishing a step before every rank's stack is reported (docs/hangs.md); 0: from
    the run's own step times, max(60 s, 20 x the median step), below the process group timeout."""
    hang_action: str = "exit"
    """After a hang report (job log and run_dir/hang-report.txt): exit (the run ends as after a failed collective:
    exit code 1, requeued when failures requeue: the Trainer's own preemption; a caller that passes its own
    should_stop and watchdog wants wait, so that its watchdog ends and requeues the run) | wait (keep waiting;
    report again after the next hang) | off."""
    trackers: str = ""
    """Besides metrics.jsonl and TensorBoard, rank 0 logs the same records to: wandb, mlflow or wandb,mlflow ('':
    none; a list of the names too); each is an extra, pip install 'torchslurm[wandb]' (docs/training.md#trackers)."""
    tracker_project: str = "torchslurm"
    """The W&B project and MLflow experiment of the run; a sweep's points are grouped by the sweep's name (W&B
    group, MLflow experiment <tracker_project>/<sweep>)."""
    mlflow_uri: str = ""
    """MLflow's store: '' is sqlite:///<run_dir's parent>/mlflow.db (one store for a sweep's points), or any
    tracking URI (sqlite:///path/mlflow.db, http://host:5000)."""

    def __post_init__(self) -> None:
        ConfigError.raise_any(_type_problems(self))  # the checks below compare values of the right type
        object.__setattr__(self, "run_dir", Path(self.run_dir))
        object.__setattr__(self, "trackers", _listed_trackers(self.trackers))
        ConfigError.raise_any([
            *(_at_least(self, name, 1)
              for name in ("epochs", "batch_size", "grad_accum_steps", "keep_last", "straggler_window")),
            *(_at_least(self, name, 0) for name in ("num_workers", "checkpoint_every_epochs", "checkpoint_every_steps",
                                                    "log_every", "straggler_every")),
            _require("straggler_threshold", self.straggler_threshold,
                     self.straggler_threshold > 1 and math.isfinite(self.straggler_threshold),
                     "a number above 1 (a multiple of the median compute time)", "straggler_threshold=1.3"),
            _require("lr", self.lr, self.lr > 0 and math.isfinite(self.lr), "a positive number", "lr=0.01"),
            _at_least(self, "grad_clip", 0, "grad_clip=0 turns clipping off; e.g. grad_clip=1.0 clips the norm."),
            _choice("lr_scaling", self.lr_scaling, LR_SCALINGS),
            _choice("amp", self.amp, AMP_MODES),
            _choice("strategy", self.strategy, STRATEGIES),
            _choice("hang_action", self.hang_action, HANG_ACTIONS),
            trackers_problem(self.trackers), project_problem(self.tracker_project), mlflow_uri_problem(self.mlflow_uri),
            _require("hang_timeout_s", self.hang_timeout_s,
                     self.hang_timeout_s >= 0 and math.isfinite(self.hang_timeout_s),
                     "0 (derived from the step times) or a positive number of seconds", "hang_timeout_s=120"),
            None if self.resume else ConfigError(
                "resume='' is empty; expected auto, never or a checkpoint directory.",
                "resume=auto continues from the newest checkpoint in run_dir."),
        ])

    def lr_factor(self, world_size: int) -> float:
        """What lr_scaling multiplies the learning rate by for `world_size` ranks."""
        return {"none": 1.0, "linear": float(world_size), "sqrt": math.sqrt(world_size)}[self.lr_scaling]

    def to_dict(self) -> dict[str, Any]:
        """Plain types only (for checkpoints and logs)."""
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}


def _require(name: str, value: object, ok: bool, expected: str, example: str) -> ConfigError | None:
    return None if ok else ConfigError(f"{name}={shown(value)}, expected {expected}.", f"e.g. {example}.")


def _at_least(config: TrainConfig, name: str, minimum: int, hint: str | None = None) -> ConfigError | None:
    value = getattr(config, name)
    return None if value >= minimum else below_minimum(name, value, minimum, hint)


def _choice(name: str, value: str, choices: tuple[str, ...]) -> ConfigError | None:
    return None if value in choices else not_one_of(name, value, choices)


DATASETS = ("digits", "mnist", "synthetic", "imagefolder", "text")
MODELS = ("auto", "convnet", "simple", "resnet18", "gpt")


@_known_keywords
@dataclass(frozen=True)
class ExampleConfig:
    """What the built-in examples train on; each field is also a `key=value` of `torchslurm train`."""

    dataset: str = "digits"
    """digits (bundled with scikit-learn) | mnist (IDX files in data_dir) | synthetic | imagefolder | text (the
    Python standard library's source, as bytes: a language-model corpus)."""
    data_dir: Path | None = None
    """Directory holding the data for mnist and imagefolder (readable by every rank)."""
    model: str = "auto"
    """auto (the dataset's usual model) | convnet (SimpleConvNet) | simple (10→50→2) | resnet18 | gpt (a small
    byte-level transformer language model, for dataset=text)."""
    momentum: float = 0.9
    """SGD momentum."""
    val_fraction: float = 0.2
    """Share of digits/synthetic held out for validation (mnist uses its own test set)."""
    max_samples: int = 0
    """Train on the first max_samples samples only, and validate on a quarter as many (0: all): a quick run."""

    def __post_init__(self) -> None:
        ConfigError.raise_any(_type_problems(self))
        if self.data_dir is not None:
            object.__setattr__(self, "data_dir", Path(self.data_dir))
        needs_dir = self.dataset in ("mnist", "imagefolder") and self.data_dir is None
        ConfigError.raise_any([
            _choice("dataset", self.dataset, DATASETS),
            _choice("model", self.model, MODELS),
            _require("momentum", self.momentum, 0 <= self.momentum < 1, "a number in [0, 1)", "momentum=0.9"),
            _require("val_fraction", self.val_fraction, 0 < self.val_fraction < 1, "a fraction in (0, 1)",
                     "val_fraction=0.2"),
            _require("max_samples", self.max_samples, self.max_samples >= 0, "0 (all) or a positive number of samples",
                     "max_samples=2000"),
            ConfigError(f"model=gpt is a language model and dataset={self.dataset} is not text." if self.model == "gpt"
                        else f"dataset=text is a language-model corpus and model={self.model} is not a language model.",
                        "use dataset=text with model=gpt.")
            if (self.model == "gpt") != (self.dataset == "text") and self.model != "auto" else None,
            ConfigError(f"dataset={self.dataset} needs data_dir, which is not set.",
                        f"add data_dir=/path/to/{self.dataset} (a directory every rank can read).")
            if needs_dir else None,
        ])

    @property
    def resolved_model(self) -> str:
        if self.model != "auto":
            return self.model
        return {"synthetic": "simple", "imagefolder": "resnet18", "text": "gpt"}.get(self.dataset, "convnet")


def _type_problems(config: TrainConfig | ExampleConfig) -> Iterator[ConfigError]:
    """A value of the wrong type, per field (the CLI's values are coerced already; the Python API's may not be)."""
    for name, kind in _field_types(type(config)).items():
        try:
            _coerce(name, kind, getattr(config, name), type(config).__name__)
        except ConfigError as exc:
            yield from exc.problems


_EMPTY_TEXT_EXAMPLES = {"trackers": "wandb,mlflow", "mlflow_uri": "sqlite:///mlflow.db", "fsdp_wrap": "Block"}


def _text_example(name: str) -> str:
    """A valid value of the text field `name` for a hint: its default, unless that is empty."""
    defaults = {f.name: f.default for cls in (TrainConfig, ExampleConfig) for f in fields(cls)}
    return _EMPTY_TEXT_EXAMPLES.get(name) or str(defaults[name])


def _listed_trackers(value: Any) -> Any:
    """trackers=["wandb", "mlflow"] (or a list in a settings file) as "wandb,mlflow"; anything else as it is."""
    if isinstance(value, list | tuple) and all(isinstance(name, str) for name in value):
        return ",".join(value)
    return value


def _field_types(cls: type) -> dict[str, str]:
    return {f.name: str(f.type) for f in fields(cls)}


def _coerce(name: str, kind: str, value: Any, source: str) -> Any:
    """`value` (parsed by YAML/TOML) as the field's type, or a ConfigError naming the field."""
    if value is None and "None" in kind:
        return None
    value = _listed_trackers(value) if name == "trackers" else value
    base = kind.replace(" | None", "")
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str | int | float) and not isinstance(value, bool),
        "Path": isinstance(value, str | Path) and str(value) != "",
    }[base]
    if not ok:
        example = {"int": "3", "float": "0.01", "bool": "true", "str": _text_example(name), "Path": "runs/demo"}[base]
        wanted = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "text",
                  "Path": "a path"}[base]
        raise ConfigError(f"{name}={shown(value)} in {source}: expected {wanted}.", f"e.g. {name}={example}.")
    return {"int": int, "float": float, "bool": bool, "str": str, "Path": Path}[base](value)


def preflight(example: ExampleConfig, cfg: TrainConfig, cuda_devices: int) -> None:
    """What the ranks would trip over only after their start-up, checked before any rank starts:
    the paths (an effect, so not in `__post_init__`) and what the settings need of the device. `cuda_devices`:
    the GPUs the ranks will see. Raises one ConfigError naming every problem."""
    ConfigError.raise_any([
        device_problem(cfg, "cuda" if cuda_devices else "cpu"),
        resume_problem(cfg.resume, cfg.run_dir),
        run_dir_problem(cfg.run_dir),
        _data_dir_problem(example),
        installed_problem(cfg.trackers, cfg.mlflow_uri),
    ])


def device_problem(cfg: TrainConfig, device_type: str) -> ConfigError | None:
    """What the settings need of the device, checked before the ranks start and again by the Trainer on its
    device: amp=fp16 needs CUDA (fp16 with a GradScaler), compile=true a compiler for its kernels; None when
    the settings fit the device."""
    if cfg.amp == "fp16" and device_type != "cuda":
        return ConfigError(f"amp=fp16 needs CUDA (fp16 with a GradScaler), but the ranks run on {device_type} (no "
                           "GPU visible here).", "use amp=bf16 on CPU, or amp=off; or run it on a GPU node.")
    return compiler_problem(device_type) if cfg.compile else None


def resume_problem(resume: str, run_dir: Path) -> ConfigError | None:
    """resume= must be auto, never or a complete checkpoint folder (checked before any rank starts, and by
    the Trainer: a TrainConfig of one's own meets it there)."""
    if resume in ("auto", "never"):
        return None
    path = Path(resume)
    folder = folder_of(path)
    hint = (f"resume=auto continues from the newest checkpoint in run_dir (resume=never starts afresh), "
            f"or name one: resume={step_dir(run_dir / CHECKPOINTS, 100)}.")
    if not folder.is_dir():
        seen = "is a file, not a folder" if folder.exists() else "no such folder"
        return ConfigError(f"resume={resume!r}: {seen}; expected auto, never or a checkpoint folder (a step-N "
                           "directory written by torchslurm).", hint)
    missing = [name for name in (STATE_FILE, MARKER) if not (folder / name).is_file()]
    if missing:
        return ConfigError(f"resume={resume!r}: {folder} has no {' or '.join(missing)}, so it is not a complete "
                           "torchslurm checkpoint; expected auto, never or a step-N directory.", hint)
    return None


def _data_dir_problem(example: ExampleConfig) -> ConfigError | None:
    if example.dataset not in ("mnist", "imagefolder") or example.data_dir is None or example.data_dir.is_dir():
        return None
    seen = "is not a directory" if example.data_dir.exists() else "does not exist"
    return ConfigError(f"data_dir={example.data_dir} {seen}; dataset={example.dataset} reads its files from a "
                       "directory every rank can read.", f"set data_dir=/path/to/{example.dataset}.")


def read_file(path: Path) -> dict[str, Any]:
    """A flat mapping from a YAML (.yaml/.yml) or TOML (.toml) file; `-` in keys becomes `_`."""
    return read_mapping(path, f"--config {path}", valid_keys())


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """`["epochs=3", "run_dir=out"]` → {"epochs": 3, "run_dir": "out"}; values are read as YAML scalars."""
    result: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{shown(item)} is not key=value.", f"e.g. epochs=3 (keys: {', '.join(valid_keys())}).")
        name = key.strip().replace("-", "_")
        kind = {**_field_types(ExampleConfig), **_field_types(TrainConfig)}.get(name, "")
        if kind.startswith(("str", "Path")) and text not in ("null", "~"):
            result[name] = text  # verbatim: run_dir=2024-01-01 or resume=007 stay text
            continue
        try:
            result[name] = load_yaml(text, f"the value of {shown(name)[1:-1]}") if text else ""  # YAML 1.2: lr=1e-3
        except yaml.YAMLError:
            result[name] = text
    return result


def valid_keys() -> list[str]:
    return [*_field_types(ExampleConfig), *_field_types(TrainConfig)]


def build(values: Mapping[str, Any], source: str = "key=value") -> tuple[ExampleConfig, TrainConfig]:
    """Split one flat mapping into the two configs, coercing and validating every value."""
    unknown = sorted(set(values) - set(valid_keys()))
    if unknown:
        raise unknown_keys_error(source, unknown, valid_keys())
    parts: list[dict[str, Any]] = [{}, {}]
    problems: list[ConfigError] = []
    for i, cls in enumerate((ExampleConfig, TrainConfig)):
        for name, kind in _field_types(cls).items():
            if name in values:
                try:
                    parts[i][name] = _coerce(name, kind, values[name], source)
                except ConfigError as exc:
                    problems.extend(exc.problems)
    ConfigError.raise_any(problems)
    built: list[Any] = []
    for i, cls in enumerate((ExampleConfig, TrainConfig)):
        try:
            built.append(cls(**parts[i]))
        except ConfigError as exc:
            problems.extend(exc.problems)
    ConfigError.raise_any(problems)
    return built[0], built[1]


def load(path: Path | None = None, overrides: Sequence[str] = (), defaults: Mapping[str, Any] | None = None,
         flags: Mapping[str, Any] | None = None) -> tuple[ExampleConfig, TrainConfig]:
    """Defaults, then the file, then flags (None = not given), then `key=value` overrides; later wins."""
    values = dict(defaults or {})
    if path is not None:
        values.update(read_file(path))
    values.update({k: str(v) if isinstance(v, Path) else v for k, v in (flags or {}).items() if v is not None})
    values.update(parse_overrides(overrides))
    where = f"--config {path} / key=value" if path else "key=value"
    return build(values, where)

