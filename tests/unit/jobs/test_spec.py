"""JobSpec construction, normalisation, validation and loading: pure logic, plain data in, data out."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from torchslurm.errors import ConfigError
from torchslurm.jobs.spec import (
    InvalidSpec,
    JobSpec,
    field_help,
    field_names,
    from_mapping,
    load,
    normalised,
    problems,
    spec_json,
)
from torchslurm.jobs.spelling import command_line


def test_bad_time_says_formats() -> None:
    with pytest.raises(ConfigError, match=r"time='1h' is not a Slurm time limit\. HINT: use minutes"):
        JobSpec(script="t.py", time="1h")


def test_unknown_choice_lists_valid() -> None:
    with pytest.raises(ConfigError, match=r"launch='mpirun' is not one of srun, torchrun\. HINT"):
        JobSpec(script="t.py", launch="mpirun")


def test_signal_normalised() -> None:
    assert JobSpec(script="t.py", signal="sigusr1").signal == "USR1"
    with pytest.raises(ConfigError, match=r"signal='KILL' is not one of USR1, USR2"):
        JobSpec(script="t.py", signal="KILL")


def test_wrong_types_rejected() -> None:
    with pytest.raises(ConfigError, match=r"nodes='2' is not an integer"):
        JobSpec(script="t.py", nodes="2")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"args='a b' is a str, expected a list of strings"):
        JobSpec(script="t.py", args="a b")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"nodes=0 must be at least 1\. HINT: set nodes to 1 or more\."):
        JobSpec(script="t.py", nodes=0)


def test_newline_in_name_rejected() -> None:
    with pytest.raises(ConfigError, match=r"name='a\\nb' contains '\\n'.*HINT: remove the line break"):
        JobSpec(script="t.py", name="a\nb")


def test_env_key_must_be_identifier() -> None:
    with pytest.raises(ConfigError, match=r"env key 'A B' is not a shell variable name"):
        JobSpec(script="t.py", env={"A B": "1"})
    assert JobSpec(script="t.py", env={"B": 1, "A": True}).env == {"A": "true", "B": "1"}  # type: ignore[dict-item]


@pytest.mark.parametrize(("value", "said"), [([0, 1], "[0, 1]"), ({"x": 1}, "{'x': 1}"), (None, "None")])
def test_an_env_value_that_is_not_one_value_is_refused(value: object, said: str) -> None:
    """`A: [0, 1]` or `A:` alone in a spec file used to be exported as A='[0, 1]' or A='None'."""
    with pytest.raises(ConfigError) as raised:
        JobSpec(script="t.py", env={"A": value})  # type: ignore[dict-item]
    assert str(raised.value) == f'env A={said}: expected text or a number. HINT: e.g. A: "0,1", or "".'


@pytest.mark.parametrize("key", ["FOO\n", "\nFOO", "FOO\r", "FÖO", "FOO="])
def test_an_env_key_with_a_trailing_newline_is_refused(key: str) -> None:
    """`--env $'FOO\\n=bar'`: a pattern ending in `$` matched before the newline and the script broke at run time."""
    with pytest.raises(ConfigError, match=r"env key .* is not a shell variable name\. HINT: use letters, digits"):
        JobSpec(script="t.py", env={key: "bar"})


@pytest.mark.parametrize(("field", "value"), [
    ("time", "١٢"), ("time", "9" * 5000), ("time", "60\n"), ("mem", "٣٢G"), ("array", "٠-٩"),
])
def test_slurm_values_take_ascii_digits_only(field: str, value: str) -> None:
    """Other scripts' digits pass `\\d` and int(), not Slurm; 5000 digits passed `\\d+` and broke int()."""
    with pytest.raises(ConfigError, match=rf"^{field}=.* (is not a Slurm|contains).*HINT"):
        JobSpec(script="t.py", **{field: value})  # type: ignore[arg-type]


def test_nproc_only_in_torchrun_mode() -> None:
    with pytest.raises(ConfigError, match=r"nproc_per_node=2 with launch='srun'.*HINT: use tasks_per_node"):
        JobSpec(script="t.py", nproc_per_node=2)


def test_load_yaml_flags_win(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("script: train.py\nnodes: 2\ngpus-per-node: 4\ntime: 90\nargs: [--epochs, '3']\n")
    spec = load(path, {"nodes": 4, "name": None})
    assert (spec.nodes, spec.gpus_per_node, spec.time, spec.args, spec.name) == (
        4, 4, "90", ("--epochs", "3"), "train")  # no name: the script's


def test_load_toml(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('script = "train.py"\nlaunch = "torchrun"\n[env]\nNCCL_DEBUG = "INFO"\n')
    spec = load(path)
    assert (spec.launch, dict(spec.env)) == ("torchrun", {"NCCL_DEBUG": "INFO"})


def test_unknown_key_lists_valid(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("script: train.py\ngpus: 4\n")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) in .*job.yaml: gpus\. HINT: valid keys are "
                                          r"script, args, name, nodes, gpus_per_node"):
        load(path)
    path.write_text("script: train.py\ngpu_per_node: 4\ntasks_per_nodes: 4\n")
    with pytest.raises(ConfigError, match=r"HINT: did you mean gpu_per_node -> gpus_per_node, tasks_per_nodes -> "
                                          r"tasks_per_node\? valid keys are script"):
        load(path)


def test_missing_script(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no `script` in flags\. HINT: give the training script after the flags "
                                          r"\(`torchslurm submit --nodes 2 train.py`\) or as `script: train.py`"):
        load(None, {"nodes": 2})


def test_slash_in_name_rejected() -> None:
    with pytest.raises(ConfigError, match=r"name='a/b' contains '/'.*HINT: use a name without '/', e.g. 'a-b'"):
        JobSpec(script="t.py", name="a/b")


def test_text_that_cannot_be_utf8_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"nic='\\ud800' holds '\\ud800', which cannot be written as UTF-8.*HINT"):
        JobSpec(script="train.py", nic="\ud800")


def test_a_setup_line_that_cannot_be_written_is_refused_naming_setup() -> None:
    with pytest.raises(ConfigError) as surrogate:
        JobSpec(script="t.py", setup=["module load x", "module load \udcff"])
    assert str(surrogate.value) == ("setup='module load \\udcff' holds '\\udcff', which cannot be written as UTF-8 "
                                    "into a job script. HINT: give setup as plain text; file names must decode as "
                                    "UTF-8.")
    with pytest.raises(ConfigError) as line_break:
        JobSpec(script="t.py", setup=["module load x\nmodule load y"])
    assert str(line_break.value) == ("setup='module load x\\nmodule load y' contains '\\n'; a job script line cannot "
                                     "hold it safely. HINT: remove the line break from setup (for several setup lines "
                                     "give a list).")


def test_every_invalid_field_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as raised:
        JobSpec(script="t.py", nodes=0, time="abc", launch="mpirun", mem="lots", name="a/b")
    assert str(raised.value).startswith("5 invalid settings:\n  launch='mpirun' is not one of srun, torchrun.")
    assert [p.message.split("=")[0].split(" ")[0] for p in raised.value.problems] == ["launch", "time", "mem", "nodes",
                                                                                    "name"]
    assert all("HINT:" in str(p) for p in raised.value.problems)
    # a wrong type is reported before the checks that compare values (they would fail on it)
    with pytest.raises(ConfigError, match=r"^2 invalid settings:\n  nodes='2' is not an integer.*\n  preemptible="):
        JobSpec(script="t.py", nodes="2", preemptible="yes", time="abc")  # type: ignore[arg-type]


def test_a_string_where_a_list_belongs_names_the_item() -> None:
    with pytest.raises(ConfigError, match=r"^setup='source x' is a str, expected a list of strings\. HINT: write "
                                          r'setup: \["source x"\] \(a list, one item per shell line\)\.$'):
        JobSpec(script="t.py", setup="source x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r'HINT: write args: \["--lr", "1"\] \(a list, one item per argument\)\.$'):
        JobSpec(script="t.py", args="--lr 1")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r'HINT: write setup: \["\.\.\.", "\.\.\."\] \(a list, one item per shell'):
        JobSpec(script="t.py", setup=3)  # type: ignore[arg-type]


def test_normalised_gives_the_canonical_values_without_touching_the_spec() -> None:
    spec = JobSpec(script="t.py")
    raw = dataclasses.replace(spec, signal="USR2")  # a valid spec to read values from
    object.__setattr__(raw, "signal", "sigusr1")
    object.__setattr__(raw, "time", 90)
    object.__setattr__(raw, "args", ["--lr", 1])
    assert normalised(raw) == {"args": ("--lr", "1"), "setup": (), "env": {}, "time": "90", "signal": "USR1"}
    assert (raw.signal, raw.time) == ("sigusr1", 90)  # normalised() returns values, it sets nothing


def test_problems_does_not_change_the_spec_it_checks() -> None:
    spec = JobSpec(script="t.py", signal="USR1", time="90")
    before = dataclasses.asdict(spec)
    object.__setattr__(spec, "signal", "sigusr1")  # not normalised: problems() reports it, changes nothing
    assert [p.message for p in problems(spec)] == ["signal='sigusr1' is not one of USR1, USR2, TERM, INT, HUP, URG."]
    assert spec.signal == "sigusr1" and {**before, "signal": "sigusr1"} == dataclasses.asdict(spec)


def test_a_numeric_time_or_mem_from_yaml_is_read_as_slurm_text() -> None:
    spec = JobSpec(script="t.py", time=90, mem=0)  # type: ignore[arg-type]
    assert (spec.time, spec.time_s, spec.mem) == ("90", 5400, "0")


def test_a_refused_spec_can_be_said_with_flags() -> None:
    with pytest.raises(InvalidSpec) as raised:
        JobSpec(script="t.py", nodes=0, mem="lots", max_restarts=2)
    assert [p.message for p in raised.value.problems] == [
        "mem='lots' is not a Slurm memory size.", "nodes=0 must be at least 1.",
        "max_restarts=2 with launch='srun': only torchrun's agent restarts workers."]
    flags = raised.value.spelled(command_line({"nodes", "mem", "max_restarts", "launch", "preemptible"}))
    assert [str(p) for p in flags.problems] == [
        "--mem='lots' is not a Slurm memory size. HINT: write e.g. --mem 32G (a number with optional K, M, G or T; "
        "0 means all memory of the node).",
        "--nodes=0 must be at least 1. HINT: set --nodes to 1 or more.",
        "--max-restarts=2 with --launch='srun': only torchrun's agent restarts workers. HINT: in srun mode a failed "
        "rank ends the step (--kill-on-bad-exit) and the job is requeued (--preemptible, max_requeues); or set "
        "--launch torchrun."]


def test_from_mapping_names_the_flags_it_is_told_of() -> None:
    with pytest.raises(ConfigError, match=r"^--time='1h' is not a Slurm time limit\. HINT: use minutes"):
        from_mapping({"script": "t.py", "time": "1h"}, spelling=command_line({"time"}))
    with pytest.raises(ConfigError, match=r"^time='1h' is not a Slurm time limit\."):
        from_mapping({"script": "t.py", "time": "1h"})


def test_every_field_has_help_for_the_command_line() -> None:
    assert field_help("nodes") == "Number of nodes (`--nodes`)."
    assert all(len(field_help(name)) > 10 for name in field_names())


# -- every refusal's whole text, in a spec file's words and in the command line's ---------------------

@pytest.mark.parametrize(("given", "in_a_file", "as_flags"), [
    ({"nodes": "2"}, "nodes='2' is not an integer. HINT: write nodes: 2 (a whole number).",
     "--nodes='2' is not an integer. HINT: write --nodes 2 (a whole number)."),
    ({"tasks_per_node": "4"}, "tasks_per_node='4' is not an integer. HINT: write tasks_per_node: 2 (a whole number).",
     "--tasks-per-node='4' is not an integer. HINT: write --tasks-per-node 2 (a whole number)."),
    ({"preemptible": "yes"}, "preemptible='yes' is not true/false. HINT: write preemptible: true.",
     "--preemptible='yes' is not true/false. HINT: write --preemptible."),
    ({"name": 3}, 'name=3 is not a string. HINT: quote it: name: "...".',
     '--name=3 is not a string. HINT: quote it: --name "...".'),
    ({"script": None}, 'script=None is not a string. HINT: quote it: script: "...".',
     '--script=None is not a string. HINT: quote it: --script "...".'),
    ({"lr": "0.1"}, "lr='0.1' is not a number. HINT: write lr: 0.001.",
     "--lr='0.1' is not a number. HINT: write --lr 0.001."),
    ({"lr": True}, "lr=True is not a number. HINT: write lr: 0.001.",
     "--lr=True is not a number. HINT: write --lr 0.001."),
    ({"array": "x"},
     "array='x' is not a Slurm array range. HINT: write e.g. array: 0-9, array: 1,3,5 or array: 0-15%4.",
     "--array='x' is not a Slurm array range. HINT: write e.g. --array 0-9, --array 1,3,5 or --array 0-15%4."),
    ({"nproc_per_node": 2},
     "nproc_per_node=2 with launch='srun': only torchrun starts several processes per task. HINT: use "
     "tasks_per_node in srun mode, or set launch: torchrun.",
     "--nproc-per-node=2 with --launch='srun': only torchrun starts several processes per task. HINT: use "
     "--tasks-per-node in srun mode, or set --launch torchrun."),
    ({"name": "a\nb"},
     "name='a\\nb' contains '\\n'; a job script line cannot hold it safely. HINT: remove the line break from name "
     "(for several setup lines give a list).",
     "--name='a\\nb' contains '\\n'; a job script line cannot hold it safely. HINT: remove the line break from "
     "--name (for several setup lines give a list)."),
    ({"name": "a/b"},
     "name='a/b' contains '/'; Slurm puts the name into log file names (%x). HINT: use a name without '/', e.g. "
     "'a-b'.",
     "--name='a/b' contains '/'; Slurm puts the name into log file names (%x). HINT: use a name without '/', e.g. "
     "'a-b'."),
    ({"output": " "}, "output is empty. HINT: give a value for output.",
     "--output is empty. HINT: give a value for --output."),
])
def test_a_refusal_says_the_value_and_the_fix_in_the_words_of_where_it_was_given(
        given: dict[str, object], in_a_file: str, as_flags: str) -> None:
    data = {"script": "t.py", **given}
    with pytest.raises(InvalidSpec) as raised:
        from_mapping(data)
    assert str(raised.value) == in_a_file
    with pytest.raises(InvalidSpec) as raised:
        from_mapping(data, spelling=command_line(set(given) | {"launch", "tasks_per_node"}))
    assert str(raised.value) == as_flags
    assert raised.value.spelled(command_line(set())).spec is raised.value.spec


def test_numbers_of_the_right_type_are_taken() -> None:
    spec = JobSpec(script="t.py", lr=0.1, batch_size=None, tasks_per_node=None, partition=None)
    assert (spec.lr, JobSpec(script="t.py", lr=1).lr) == (0.1, 1)
    assert JobSpec(script="t.py", launch="torchrun", max_restarts=2).max_restarts == 2


def test_env_that_is_not_a_mapping_is_refused_with_an_example() -> None:
    with pytest.raises(ConfigError) as raised:
        JobSpec(script="t.py", env=["A=1"])  # type: ignore[arg-type]
    assert str(raised.value) == "env=['A=1'] is not a mapping. HINT: write env: {NCCL_DEBUG: INFO}."


def test_from_mapping_names_its_source_and_the_command_in_what_it_refuses() -> None:
    with pytest.raises(ConfigError) as raised:
        from_mapping({"nodes": 2})
    assert str(raised.value) == ("no `script` in spec. HINT: give the training script after the flags (`torchslurm "
                                 "submit --nodes 2 train.py`) or as `script: train.py` in the --spec file.")
    with pytest.raises(ConfigError, match=r"^unknown key\(s\) in spec: gpus\."):
        from_mapping({"script": "t.py", "gpus": 2})
    with pytest.raises(ConfigError, match=r"^no `script` in flags\. HINT: give the training script after the flags "
                                          r"\(`torchslurm script --nodes 1 train.py`\)"):
        load(None, {"nodes": 1}, command="torchslurm script --nodes 1")


def test_a_spec_file_that_holds_no_mapping_is_named_with_the_valid_keys(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("- train.py\n")
    with pytest.raises(ConfigError) as raised:
        load(path)
    assert str(raised.value).startswith(f"job spec {path} holds a list, expected a mapping. HINT: write `key: value` "
                                        "lines; valid keys: script, args, name, nodes, ")


def test_setup_lines_are_kept_as_text_and_a_script_without_a_stem_names_the_job_torchslurm() -> None:
    assert JobSpec(script="t.py", setup=["module load x", 3]).setup == ("module load x", "3")  # type: ignore[list-item]
    assert JobSpec(script=" .py").name == "torchslurm"


def test_a_spec_as_data_holds_what_differs_from_the_defaults_in_field_order() -> None:
    spec = JobSpec(script="t.py", time="5", nodes=2, args=["--lr", "1"], env={"A": "1"}, name="café")
    assert spec.to_dict() == {"script": "t.py", "args": ["--lr", "1"], "name": "café", "nodes": 2, "time": "5",
                              "env": {"A": "1"}}
    assert JobSpec(script="t.py").to_dict() == {"script": "t.py", "name": "t"}
    assert spec_json(spec) == ('{"script": "t.py", "args": ["--lr", "1"], "name": "caf\\u00e9", "nodes": 2, '
                               '"time": "5", "env": {"A": "1"}}')
