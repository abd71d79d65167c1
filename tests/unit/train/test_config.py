import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from torchslurm.errors import ConfigError
from torchslurm.train import config
from torchslurm.train.config import ExampleConfig, TrainConfig


def test_defaults_are_valid_and_plain() -> None:
    cfg = TrainConfig()
    assert cfg.to_dict()["run_dir"] == "runs/latest" and isinstance(cfg.run_dir, Path)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"epochs": 0}, r"^epochs=0 must be at least 1\. HINT: set epochs to 1 or more\.$"),
    ({"lr": -1.0}, r"lr=-1\.0, expected a positive number\. HINT"),
    ({"lr_scaling": "cubic"},
     r"^lr_scaling='cubic' is not one of none, linear, sqrt\. HINT: set lr_scaling to one of: none, linear, sqrt\.$"),
    ({"amp": "fp8"}, r"amp='fp8' is not one of off, bf16, fp16\."),
    ({"log_every": -1}, r"log_every=-1 must be at least 0\. HINT: set log_every to 0 or more\."),
    ({"grad_clip": -0.5}, r"grad_clip=-0\.5 must be at least 0\. HINT: grad_clip=0 turns clipping off"),
    ({"resume": ""}, r"resume='' is empty; expected auto, never or a checkpoint directory"),
    ({"straggler_every": -1}, r"^straggler_every=-1 must be at least 0\. HINT: set straggler_every to 0 or more\.$"),
    ({"straggler_window": 0}, r"^straggler_window=0 must be at least 1\."),
    ({"straggler_threshold": 1.0}, r"^straggler_threshold=1\.0, expected a number above 1 \(a multiple of the median "
                                   r"compute time\)\. HINT: e\.g\. straggler_threshold=1\.3\.$"),
])
def test_train_config_rejects(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**kwargs)  # type: ignore[arg-type]


def test_yaml_file_then_overrides_win(tmp_path: Path) -> None:
    (tmp_path / "cfg.yaml").write_text("epochs: 7\nbatch-size: 16\nlr: 0.1\ndataset: synthetic\n")
    example, cfg = config.load(tmp_path / "cfg.yaml", ["epochs=2", "run_dir=out dir", "amp=bf16"],
                               defaults={"epochs": 4, "seed": 3})
    assert (cfg.epochs, cfg.batch_size, cfg.lr, cfg.amp, cfg.seed) == (2, 16, 0.1, "bf16", 3)
    assert cfg.run_dir == Path("out dir") and example.dataset == "synthetic" and example.resolved_model == "simple"


def test_toml_file(tmp_path: Path) -> None:
    (tmp_path / "cfg.toml").write_text('epochs = 3\nlr_scaling = "sqrt"\ngrad_clip = 1\n')
    _, cfg = config.load(tmp_path / "cfg.toml")
    assert (cfg.epochs, cfg.lr_scaling, cfg.grad_clip) == (3, "sqrt", 1.0)


def test_int_lr_is_accepted_but_text_epochs_is_not() -> None:
    assert config.load(overrides=["lr=1"])[1].lr == 1.0
    with pytest.raises(ConfigError, match=r"epochs='many' in key=value: expected an integer\. HINT: e\.g\. epochs=3"):
        config.load(overrides=["epochs=many"])


def test_unknown_key_suggests_the_closest_and_lists_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown key\(s\) in key=value: epoch\. HINT: did you mean epoch -> "
                                          r"epochs\? valid keys are dataset, data_dir, .*epochs, batch_size"):
        config.load(overrides=["epoch=3"])
    with pytest.raises(ConfigError, match=r"unknown key\(s\) in key=value: zzz\. HINT: valid keys are dataset"):
        config.load(overrides=["zzz=3"])


def test_the_python_api_gets_did_you_mean_for_an_unknown_keyword_too() -> None:
    with pytest.raises(ConfigError, match=r"unknown key\(s\) in TrainConfig\(\.\.\.\): epoch\. HINT: did you mean "
                                          r"epoch -> epochs\? valid keys are epochs, batch_size"):
        TrainConfig(epoch=2)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"in ExampleConfig\(\.\.\.\): datset\. HINT: did you mean datset -> dataset"):
        ExampleConfig(datset="text")  # type: ignore[call-arg]
    assert TrainConfig(epochs=2).epochs == 2 and "epochs: 'int' = 5" in str(inspect.signature(TrainConfig))


def test_override_without_equals() -> None:
    with pytest.raises(ConfigError, match=r"'epochs' is not key=value\. HINT: e\.g\. epochs=3"):
        config.parse_overrides(["epochs"])


def test_mnist_needs_data_dir() -> None:
    with pytest.raises(ConfigError, match=r"dataset=mnist needs data_dir, which is not set\. HINT: add data_dir="):
        ExampleConfig(dataset="mnist")


def test_bad_yaml_is_reported(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("epochs: [1,\n")
    with pytest.raises(ConfigError, match=r"(?s)--config .*bad\.yaml is not valid yaml: .*HINT: fix the syntax"):
        config.load(tmp_path / "bad.yaml")


def test_null_data_dir_and_resume_path(tmp_path: Path) -> None:
    example, cfg = config.load(overrides=["data_dir=null", f"resume={tmp_path}/step-000000005"])
    assert example.data_dir is None and cfg.resume == f"{tmp_path}/step-000000005"


def test_text_settings_stay_verbatim() -> None:
    example, cfg = config.load(overrides=["run_dir=2024-01-01", "resume=007", "data_dir=null"])
    assert cfg.run_dir == Path("2024-01-01") and cfg.resume == "007" and example.data_dir is None


def test_every_invalid_setting_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as raised:
        config.load(overrides=["epochs=-3", "batch_size=0", "amp=fp8", "dataset=mnist"])
    lines = str(raised.value).splitlines()
    assert lines[0] == "4 invalid settings:"
    assert lines[1:] == [
        "  dataset=mnist needs data_dir, which is not set. HINT: add data_dir=/path/to/mnist (a directory every "
        "rank can read).",
        "  epochs=-3 must be at least 1. HINT: set epochs to 1 or more.",
        "  batch_size=0 must be at least 1. HINT: set batch_size to 1 or more.",
        "  amp='fp8' is not one of off, bf16, fp16. HINT: set amp to one of: off, bf16, fp16.",
    ]
    assert len(raised.value.problems) == 4
    with pytest.raises(ConfigError, match=r"^2 invalid settings:\n  epochs='x' in key=value: expected an integer\. "
                                          r"HINT: e\.g\. epochs=3\.\n  lr='abc' in key=value: expected a number"):
        config.load(overrides=["epochs=x", "lr=abc"])


def test_the_python_api_gets_a_config_error_for_a_wrong_type_not_a_type_error() -> None:
    with pytest.raises(ConfigError, match=r"^lr=None in TrainConfig: expected a number\. HINT: e\.g\. lr=0\.01\.$"):
        TrainConfig(epochs=0, lr=None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^2 invalid settings:\n  dataset=None in ExampleConfig: expected text"):
        ExampleConfig(dataset=None, momentum="high")  # type: ignore[arg-type]
    # the hint's example is a value the field takes (it was `auto` for every text field)
    with pytest.raises(ConfigError, match=r"^strategy=True in TrainConfig: expected text\. HINT: e\.g\. "
                                          r"strategy=ddp\.$"):
        TrainConfig(strategy=True)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^trackers=\[1\] in TrainConfig: expected text\. HINT: e\.g\. "
                                          r"trackers=wandb,mlflow\.$"):
        TrainConfig(trackers=[1])  # type: ignore[arg-type]


def test_trackers_may_be_a_list_of_names() -> None:
    assert TrainConfig(trackers=["wandb", "mlflow"]).trackers == "wandb,mlflow"  # type: ignore[arg-type]
    assert TrainConfig(trackers=()).trackers == ""  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^trackers='neptune' is not one of wandb, mlflow"):
        TrainConfig(trackers=["neptune"])  # type: ignore[arg-type]


def test_max_samples_must_not_be_negative() -> None:
    from torchslurm.train.config import ExampleConfig

    assert ExampleConfig(max_samples=500).max_samples == 500
    with pytest.raises(ConfigError, match=r"max_samples=-1, expected 0 \(all\) or a positive number") as caught:
        ExampleConfig(max_samples=-1)
    assert "max_samples=2000" in caught.value.hint


def _refusal(make: Callable[[], object]) -> tuple[str, str | None]:
    with pytest.raises(ConfigError) as info:
        make()
    return info.value.message, info.value.hint


def _whole(problem: ConfigError | None) -> tuple[str, str | None]:
    assert problem is not None
    return problem.message, problem.hint


AT_LEAST_1 = ("epochs", "batch_size", "grad_accum_steps", "keep_last", "straggler_window")
AT_LEAST_0 = ("num_workers", "checkpoint_every_epochs", "checkpoint_every_steps", "log_every", "straggler_every")
THRESHOLD = ("a number above 1 (a multiple of the median compute time)", "e.g. straggler_threshold=1.3.")
HANG = ("0 (derived from the step times) or a positive number of seconds", "e.g. hang_timeout_s=120.")


@pytest.mark.parametrize(("kwargs", "message", "hint"), [
    *(({name: 0}, f"{name}=0 must be at least 1.", f"set {name} to 1 or more.") for name in AT_LEAST_1),
    *(({name: -1}, f"{name}=-1 must be at least 0.", f"set {name} to 0 or more.") for name in AT_LEAST_0),
    *(({"straggler_threshold": value}, f"straggler_threshold={value!r}, expected {THRESHOLD[0]}.", THRESHOLD[1])
      for value in (1.0, 0.5, math.inf, math.nan)),
    *(({"lr": value}, f"lr={value!r}, expected a positive number.", "e.g. lr=0.01.")
      for value in (0.0, -1.0, math.inf, math.nan)),
    ({"grad_clip": -0.5}, "grad_clip=-0.5 must be at least 0.",
     "grad_clip=0 turns clipping off; e.g. grad_clip=1.0 clips the norm."),
    ({"lr_scaling": "cubic"}, "lr_scaling='cubic' is not one of none, linear, sqrt.",
     "set lr_scaling to one of: none, linear, sqrt."),
    ({"amp": "fp8"}, "amp='fp8' is not one of off, bf16, fp16.", "set amp to one of: off, bf16, fp16."),
    ({"strategy": "zero"}, "strategy='zero' is not one of ddp, fsdp.", "set strategy to one of: ddp, fsdp."),
    ({"hang_action": "kill"}, "hang_action='kill' is not one of exit, wait, off.",
     "set hang_action to one of: exit, wait, off."),
    ({"trackers": "neptune"}, "trackers='neptune' is not one of wandb, mlflow.",
     "e.g. trackers=wandb or trackers=wandb,mlflow ('' for none)."),
    ({"tracker_project": " "}, "tracker_project=' ' is empty; expected a W&B project / MLflow experiment name (at "
     "most 128 characters, none of / \\ # ? % :).", "e.g. tracker_project=mnist-sweeps."),
    ({"mlflow_uri": "/data/store"}, "mlflow_uri='/data/store' is a path, not a tracking URI.",
     "a local store is a SQLite file: mlflow_uri=sqlite:////data/store/mlflow.db; a server: "
     "mlflow_uri=http://host:5000; empty: run_dir's parent/mlflow.db."),
    *(({"hang_timeout_s": value}, f"hang_timeout_s={value!r}, expected {HANG[0]}.", HANG[1])
      for value in (-1.0, math.inf, math.nan)),
    ({"resume": ""}, "resume='' is empty; expected auto, never or a checkpoint directory.",
     "resume=auto continues from the newest checkpoint in run_dir."),
    ({"run_dir": ""}, "run_dir='' in TrainConfig: expected a path.", "e.g. run_dir=runs/demo."),
    ({"fsdp_wrap": ["Block"]}, "fsdp_wrap=['Block'] in TrainConfig: expected text.", "e.g. fsdp_wrap=Block."),
    ({"trackers": ["wandb", 1]}, "trackers=['wandb', 1] in TrainConfig: expected text.",
     "e.g. trackers=wandb,mlflow."),
])
def test_every_refusal_of_a_train_config_is_said_whole(kwargs: dict[str, object], message: str, hint: str) -> None:
    assert _refusal(lambda: TrainConfig(**kwargs)) == (message, hint)  # type: ignore[arg-type]


def test_every_number_may_sit_on_its_bound() -> None:
    at_bounds = {**dict.fromkeys(AT_LEAST_1, 1), **dict.fromkeys(AT_LEAST_0, 0), "grad_clip": 0.0,
                 "hang_timeout_s": 0.0, "straggler_threshold": 1.000001, "lr": 1e-12}
    cfg = TrainConfig(**at_bounds)  # type: ignore[arg-type]
    assert {name: getattr(cfg, name) for name in at_bounds} == at_bounds


def test_text_and_paths_are_taken_as_given_and_positional_arguments_too() -> None:
    cfg = TrainConfig(3, 8, run_dir="out", trackers=("mlflow",), mlflow_uri="http://host:5000")  # type: ignore[arg-type]
    assert (cfg.epochs, cfg.batch_size, cfg.run_dir, cfg.trackers) == (3, 8, Path("out"), "mlflow")
    assert ExampleConfig(dataset="mnist", data_dir="data").data_dir == Path("data")  # type: ignore[arg-type]
    assert ExampleConfig(dataset="text", model="gpt").resolved_model == "gpt"


def test_known_keywords_wraps_a_dataclass_s_constructor_in_place() -> None:
    @dataclass(frozen=True)
    class Point:
        x: int = 0
        y: int = 0

    assert config._known_keywords(Point) is Point
    assert (Point(1, y=2).x, Point(1, y=2).y) == (1, 2)
    assert _refusal(lambda: Point(z=3)) == ("unknown key(s) in Point(...): z.", "valid keys are x, y.")  # type: ignore[call-arg]
    assert str(inspect.signature(Point)) == "(x: int = 0, y: int = 0) -> None"


def test_several_unknown_keywords_are_named_in_order_with_every_valid_key() -> None:
    names = ", ".join(f.name for f in fields(TrainConfig))
    assert _refusal(lambda: TrainConfig(zz=1, aa=2)) == (  # type: ignore[call-arg]
        "unknown key(s) in TrainConfig(...): aa, zz.", f"valid keys are {names}.")


@pytest.mark.parametrize(("scaling", "factor"), [("none", 1.0), ("linear", 16.0), ("sqrt", 4.0)])
def test_lr_scaling_multiplies_lr_by_one_the_world_size_or_its_square_root(scaling: str, factor: float) -> None:
    assert TrainConfig(lr_scaling=scaling).lr_factor(16) == factor


def test_to_dict_holds_every_field_with_the_run_dir_as_text() -> None:
    cfg = TrainConfig(run_dir=Path("a/b"), epochs=3, trackers="wandb")
    plain = cfg.to_dict()
    assert plain == {**{f.name: getattr(cfg, f.name) for f in fields(TrainConfig)}, "run_dir": "a/b"}
    assert plain["epochs"] == 3 and plain["trackers"] == "wandb"


@pytest.mark.parametrize(("kwargs", "message", "hint"), [
    ({"dataset": "cifar"}, "dataset='cifar' is not one of digits, mnist, synthetic, imagefolder, text.",
     "set dataset to one of: digits, mnist, synthetic, imagefolder, text."),
    ({"model": "vgg"}, "model='vgg' is not one of auto, convnet, simple, resnet18, gpt.",
     "set model to one of: auto, convnet, simple, resnet18, gpt."),
    ({"momentum": 1.0}, "momentum=1.0, expected a number in [0, 1).", "e.g. momentum=0.9."),
    ({"momentum": -0.1}, "momentum=-0.1, expected a number in [0, 1).", "e.g. momentum=0.9."),
    ({"val_fraction": 0.0}, "val_fraction=0.0, expected a fraction in (0, 1).", "e.g. val_fraction=0.2."),
    ({"val_fraction": 1.0}, "val_fraction=1.0, expected a fraction in (0, 1).", "e.g. val_fraction=0.2."),
    ({"max_samples": -1}, "max_samples=-1, expected 0 (all) or a positive number of samples.",
     "e.g. max_samples=2000."),
    ({"model": "gpt"}, "model=gpt is a language model and dataset=digits is not text.",
     "use dataset=text with model=gpt."),
    ({"dataset": "text", "model": "convnet"},
     "dataset=text is a language-model corpus and model=convnet is not a language model.",
     "use dataset=text with model=gpt."),
    ({"dataset": "imagefolder"}, "dataset=imagefolder needs data_dir, which is not set.",
     "add data_dir=/path/to/imagefolder (a directory every rank can read)."),
    ({"momentum": "high"}, "momentum='high' in ExampleConfig: expected a number.", "e.g. momentum=0.01."),
])
def test_every_refusal_of_an_example_config_is_said_whole(kwargs: dict[str, object], message: str, hint: str) -> None:
    assert _refusal(lambda: ExampleConfig(**kwargs)) == (message, hint)  # type: ignore[arg-type]


def test_the_example_bounds_that_are_allowed() -> None:
    example = ExampleConfig(momentum=0.0, val_fraction=0.999, max_samples=0)
    assert (example.momentum, example.val_fraction, example.max_samples) == (0.0, 0.999, 0)
    assert ExampleConfig(dataset="text").resolved_model == "gpt"
    assert ExampleConfig(dataset="digits", model="convnet").data_dir is None


TEXT_EXAMPLES = {"lr_scaling": "none", "amp": "off", "resume": "auto", "strategy": "ddp", "fsdp_wrap": "Block",
                 "hang_action": "exit", "trackers": "wandb,mlflow", "tracker_project": "torchslurm",
                 "mlflow_uri": "sqlite:///mlflow.db", "dataset": "digits", "model": "auto"}


@pytest.mark.parametrize(("name", "example"), TEXT_EXAMPLES.items())
def test_the_hint_for_a_text_field_of_the_wrong_type_shows_a_value_it_takes(name: str, example: str) -> None:
    assert _refusal(lambda: config.build({name: False}, "--config c.yaml")) == (
        f"{name}=False in --config c.yaml: expected text.", f"e.g. {name}={example}.")


def test_every_text_field_has_an_example() -> None:
    texts = {f.name for cls in (TrainConfig, ExampleConfig) for f in fields(cls) if f.type == "str"}
    assert texts == set(TEXT_EXAMPLES)


@pytest.mark.parametrize(("name", "value", "message", "hint"), [
    ("epochs", True, "epochs=True in key=value: expected an integer.", "e.g. epochs=3."),
    ("epochs", 2.5, "epochs=2.5 in key=value: expected an integer.", "e.g. epochs=3."),
    ("lr", True, "lr=True in key=value: expected a number.", "e.g. lr=0.01."),
    ("lr", "fast", "lr='fast' in key=value: expected a number.", "e.g. lr=0.01."),
    ("pin_memory", 1, "pin_memory=1 in key=value: expected true or false.", "e.g. pin_memory=true."),
    ("run_dir", "", "run_dir='' in key=value: expected a path.", "e.g. run_dir=runs/demo."),
    ("run_dir", 3, "run_dir=3 in key=value: expected a path.", "e.g. run_dir=runs/demo."),
    ("run_dir", None, "run_dir=None in key=value: expected a path.", "e.g. run_dir=runs/demo."),
    ("data_dir", "", "data_dir='' in key=value: expected a path.", "e.g. data_dir=runs/demo."),
])
def test_a_value_of_the_wrong_type_is_refused_whole(name: str, value: object, message: str, hint: str) -> None:
    assert _refusal(lambda: config.build({name: value})) == (message, hint)


def test_values_are_coerced_to_their_fields_types() -> None:
    example, cfg = config.build({"lr": 1, "fsdp_wrap": 7, "run_dir": Path("p"), "pin_memory": False, "epochs": 4,
                                 "data_dir": None, "trackers": ["wandb", "mlflow"]})
    assert (cfg.lr, cfg.fsdp_wrap, cfg.run_dir, cfg.pin_memory, cfg.epochs) == (1.0, "7", Path("p"), False, 4)
    assert type(cfg.lr) is float and example.data_dir is None and cfg.trackers == "wandb,mlflow"


def test_build_names_its_source_and_reports_every_bad_value_of_both_configs() -> None:
    assert _refusal(lambda: config.build({"zzz": 1, "epochs": 2})) == (
        "unknown key(s) in key=value: zzz.", f"valid keys are {', '.join(config.valid_keys())}.")
    with pytest.raises(ConfigError) as info:
        config.build({"epochs": "x", "momentum": "y"}, "a sweep point")
    assert [(p.message, p.hint) for p in info.value.problems] == [
        ("momentum='y' in a sweep point: expected a number.", "e.g. momentum=0.01."),
        ("epochs='x' in a sweep point: expected an integer.", "e.g. epochs=3.")]
    with pytest.raises(ConfigError) as info:
        config.build({"epochs": 0, "momentum": 1.0})
    assert [p.message for p in info.value.problems] == [
        "momentum=1.0, expected a number in [0, 1).", "epochs=0 must be at least 1."]


def test_the_valid_keys_are_the_example_fields_then_the_training_fields() -> None:
    assert config.valid_keys() == [f.name for cls in (ExampleConfig, TrainConfig) for f in fields(cls)]


def test_overrides_take_dashes_blanks_nulls_and_empty_values() -> None:
    assert config.parse_overrides([" batch-size =3", "data_dir=~", "resume=null", "trackers=", "epochs=",
                                   "lr=1e-3", "fsdp_wrap=1e3", "run_dir=true", "zzz=4", "momentum=[1,",
                                   "tracker_project=a=b"]) == {
        "batch_size": 3, "data_dir": None, "resume": None, "trackers": "", "epochs": "", "lr": 0.001,
        "fsdp_wrap": "1e3", "run_dir": "true", "zzz": 4, "momentum": "[1,", "tracker_project": "a=b"}


def test_an_override_that_is_not_key_value_or_too_deep_is_refused_whole() -> None:
    keys = ", ".join(config.valid_keys())
    for item in ("=3", "epochs"):
        assert _refusal(functools.partial(config.parse_overrides, [item])) == (
            f"{item!r} is not key=value.", f"e.g. epochs=3 (keys: {keys}).")
    message, _ = _refusal(lambda: config.parse_overrides(["batch-size=" + "[" * 200 + "]" * 200]))
    assert message.startswith("the value of batch_size nests lists or mappings more than ")


def test_a_file_s_keys_values_and_name_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    keys = ", ".join(config.valid_keys())
    path.write_text("- epochs: 3\n")
    assert _refusal(lambda: config.read_file(path)) == (
        f"--config {path} holds a list, expected a mapping.", f"write `key: value` lines; valid keys: {keys}.")
    path.write_text("epoch: 3\nbatch-size: 4\n")
    assert config.read_file(path) == {"epoch": 3, "batch_size": 4}
    assert _refusal(lambda: config.load(path)) == (
        f"unknown key(s) in --config {path} / key=value: epoch.",
        f"did you mean epoch -> epochs? valid keys are {keys}.")
    path.write_text("epochs: x\n")
    assert _refusal(lambda: config.load(path)) == (
        f"epochs='x' in --config {path} / key=value: expected an integer.", "e.g. epochs=3.")
    assert _refusal(lambda: config.load(overrides=["epochs=x"]))[0] == "epochs='x' in key=value: expected an integer."


def test_flags_come_after_the_file_and_before_the_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("epochs = 3\nseed = 5\nlr = 0.5\n")
    _, cfg = config.load(path, ["lr=0.25"], defaults={"seed": 1, "keep_last": 4},
                         flags={"epochs": 9, "run_dir": Path("r"), "seed": None, "lr": 0.125})
    assert (cfg.epochs, cfg.seed, cfg.lr, cfg.keep_last, cfg.run_dir) == (9, 5, 0.25, 4, Path("r"))
    assert config.load(flags={"resume": Path("never")})[1].resume == "never"  # a path-typed flag for a text setting
    assert config.load()[1] == TrainConfig()


def test_the_settings_must_fit_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "compiler_problem", lambda device_type: ConfigError(f"no compiler for {device_type}"))
    assert config.device_problem(TrainConfig(amp="fp16"), "cuda") is None
    assert config.device_problem(TrainConfig(amp="bf16"), "cpu") is None
    for device_type in ("cpu", "mps"):
        assert _whole(config.device_problem(TrainConfig(amp="fp16"), device_type)) == (
            f"amp=fp16 needs CUDA (fp16 with a GradScaler), but the ranks run on {device_type} (no GPU visible here).",
            "use amp=bf16 on CPU, or amp=off; or run it on a GPU node.")
    problem = config.device_problem(TrainConfig(compile=True), "cuda")
    assert problem is not None and problem.message == "no compiler for cuda"


def _checkpoint(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_text("")
    return folder


def test_resume_names_auto_never_or_a_complete_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    hint = ("resume=auto continues from the newest checkpoint in run_dir (resume=never starts afresh), or name one: "
            f"resume={run_dir}/checkpoints/step-000000100.")
    expected = "expected auto, never or a checkpoint folder (a step-N directory written by torchslurm)."
    complete = _checkpoint(tmp_path / "step-000000004", "state.pt", "COMPLETE")
    for resume in ("auto", "never", str(complete), str(complete / "state.pt")):
        assert config.resume_problem(resume, run_dir) is None
    (tmp_path / "file").write_text("")
    cases = {"sometimes": f"resume='sometimes': no such folder; {expected}",
             str(tmp_path / "file"): f"resume='{tmp_path}/file': is a file, not a folder; {expected}"}
    for names, missing in (((), "state.pt or COMPLETE"), (("state.pt",), "COMPLETE"), (("COMPLETE",), "state.pt")):
        folder = _checkpoint(tmp_path / f"step-{len(cases)}", *names)
        cases[str(folder)] = (f"resume='{folder}': {folder} has no {missing}, so it is not a complete torchslurm "
                              "checkpoint; expected auto, never or a step-N directory.")
    (_checkpoint(tmp_path / "step-9", "COMPLETE") / "state.pt").mkdir()
    cases[str(tmp_path / "step-9")] = (f"resume='{tmp_path}/step-9': {tmp_path}/step-9 has no state.pt, so it is not "
                                       "a complete torchslurm checkpoint; expected auto, never or a step-N directory.")
    for resume, message in cases.items():
        assert _whole(config.resume_problem(resume, run_dir)) == (message, hint)


def test_preflight_names_every_problem_before_any_rank_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "installed_problem", lambda trackers, uri: ConfigError(f"{trackers} at {uri}")
                        if trackers else None)
    (tmp_path / "file").write_text("")
    example = ExampleConfig(dataset="mnist", data_dir=tmp_path / "missing")
    cfg = TrainConfig(amp="fp16", resume="sometimes", run_dir=tmp_path / "file", trackers="mlflow",
                      mlflow_uri="http://host:5000")
    with pytest.raises(ConfigError) as info:
        config.preflight(example, cfg, cuda_devices=0)
    assert [p.message for p in info.value.problems] == [
        "amp=fp16 needs CUDA (fp16 with a GradScaler), but the ranks run on cpu (no GPU visible here).",
        "resume='sometimes': no such folder; expected auto, never or a checkpoint folder (a step-N directory "
        "written by torchslurm).",
        f"run_dir={tmp_path}/file is an existing file; expected a directory for checkpoints/ and metrics.jsonl.",
        f"data_dir={tmp_path}/missing does not exist; dataset=mnist reads its files from a directory every rank can "
        "read.",
        "mlflow at http://host:5000"]
    assert info.value.problems[3].hint == "set data_dir=/path/to/mnist."
    config.preflight(ExampleConfig(), TrainConfig(amp="fp16", run_dir=tmp_path / "run"), cuda_devices=1)


def test_preflight_wants_a_data_dir_that_is_a_directory_only_where_the_dataset_reads_one(tmp_path: Path) -> None:
    file, folder = tmp_path / "file", tmp_path / "data"
    file.write_text("")
    folder.mkdir()
    cfg = TrainConfig(run_dir=tmp_path / "run")
    assert _refusal(lambda: config.preflight(ExampleConfig(dataset="imagefolder", data_dir=file), cfg, 0)) == (
        f"data_dir={file} is not a directory; dataset=imagefolder reads its files from a directory every rank can "
        "read.", "set data_dir=/path/to/imagefolder.")
    for example in (ExampleConfig(dataset="mnist", data_dir=folder), ExampleConfig(dataset="imagefolder",
                    data_dir=folder), ExampleConfig(dataset="digits", data_dir=file), ExampleConfig(dataset="text")):
        config.preflight(example, cfg, 0)
