import inspect
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
