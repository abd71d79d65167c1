"""sandbox.trust: root never uses a lab directory, sandbox.json, munge.key or lock file that another
user could have made (they live in world-writable /tmp). Only folders of this test's own tmp_path:
nothing here touches the running sandbox."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from torchslurm.errors import EnvError
from torchslurm.sandbox import cluster, trust
from torchslurm.sandbox.config import SandboxConfig, state_json

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")


def _stat(mode: int, uid: int = 0) -> os.stat_result:
    return os.stat_result((mode, 1, 1, 1, uid, 0, 0, 0, 0, 0))


@pytest.mark.parametrize(("st", "kind", "reason"), [
    (_stat(stat.S_IFDIR | 0o700), "dir", None),
    (_stat(stat.S_IFDIR | 0o755), "dir", None),
    (_stat(stat.S_IFLNK | 0o777), "dir", "/x is a symbolic link"),
    (_stat(stat.S_IFDIR | 0o700, uid=NOBODY), "dir", "/x belongs to uid 65534, not to uid 0 who runs the sandbox"),
    (_stat(stat.S_IFDIR | 0o775), "dir", "/x can be written by others (mode 0775)"),
    (_stat(stat.S_IFDIR | 0o1777), "parent", None),  # /tmp: others cannot rename what is ours
    (_stat(stat.S_IFDIR | 0o777), "parent", "/x can be written by others (mode 0777)"),
    (_stat(stat.S_IFDIR | 0o1777), "dir", "/x can be written by others (mode 1777)"),
    (_stat(stat.S_IFREG | 0o400), "file", None),
    (_stat(stat.S_IFREG | 0o646), "file", "/x can be written by others (mode 0646)"),
    (_stat(stat.S_IFDIR | 0o700), "file", "/x is not a regular file"),
    (_stat(stat.S_IFREG | 0o600), "dir", "/x is not a directory"),
])
def test_what_root_trusts(st: os.stat_result, kind: str, reason: str | None) -> None:
    assert trust.problem(Path("/x"), st, 0, kind) == reason


def test_a_new_lab_dir_is_roots_alone_and_a_linked_one_is_refused(tmp_path: Path) -> None:
    trust.make_lab_dir(tmp_path / "lab")
    assert stat.S_IMODE((tmp_path / "lab").stat().st_mode) == 0o700
    (tmp_path / "victim").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "victim")
    with pytest.raises(EnvError, match=r"linked is a symbolic link; the sandbox runs as root and does not use "
                                       r"files others could have made.*HINT: remove it"):
        trust.make_lab_dir(tmp_path / "linked")
    with pytest.raises(EnvError, match=r"--lab-dir=.*/absent/lab: its folder .*/absent does not exist"):
        trust.make_lab_dir(tmp_path / "absent" / "lab")
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    with pytest.raises(EnvError, match=r"open can be written by others \(mode 0777\)"):
        trust.make_lab_dir(tmp_path / "open" / "lab")


@as_root
def test_a_lab_dir_or_munge_key_of_another_user_is_refused(tmp_path: Path) -> None:
    (tmp_path / "theirs").mkdir()
    os.chown(tmp_path / "theirs", NOBODY, NOBODY)
    with pytest.raises(EnvError, match=r"theirs belongs to uid 65534, not to uid 0 who runs the sandbox"):
        trust.make_lab_dir(tmp_path / "theirs")
    key = tmp_path / "munge.key"
    key.write_bytes(b"their key")
    os.chown(key, NOBODY, NOBODY)
    with pytest.raises(EnvError, match=r"munge.key belongs to uid 65534"):
        trust.existing(key, "file")


def _lab(tmp_path: Path, recorded: Path | None = None) -> Path:
    lab = tmp_path / "lab"
    lab.mkdir(mode=0o700)
    cfg = SandboxConfig(lab_dir=recorded or lab)
    (lab / "sandbox.json").write_text(state_json(cfg))
    return lab


def test_a_sandbox_json_naming_another_directory_is_refused(tmp_path: Path) -> None:
    """Another user's sandbox.json in the default lab dir once made root's `up` rmtree what it named."""
    victim = tmp_path / "victim"
    victim.mkdir()
    lab = _lab(tmp_path, recorded=victim)
    with pytest.raises(EnvError, match=rf"sandbox.json names the lab directory {victim}, but lies in {lab}; "
                                       rf"`down` would delete {victim}\. HINT: remove"):
        cluster.load_config(lab)
    assert victim.is_dir()


def test_only_a_trusted_sandbox_json_is_read(tmp_path: Path) -> None:
    lab = _lab(tmp_path)
    config = cluster.load_config(lab)
    assert config is not None and config.lab_dir == lab
    (lab / "sandbox.json").chmod(0o666)
    with pytest.raises(EnvError, match=r"sandbox.json can be written by others \(mode 0666\)"):
        cluster.load_config(lab)
    (lab / "sandbox.json").write_text(json.dumps({"lab_dir": str(lab)}))
    (lab / "sandbox.json").chmod(0o600)
    with pytest.raises(EnvError, match=r"sandbox.json cannot be read \('nodes'\)"):
        cluster.load_config(lab)
    assert cluster.load_config(tmp_path / "absent") is None


def test_the_lock_is_never_opened_through_a_link(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    (tmp_path / "sandbox.lock").symlink_to(target)
    link = tmp_path / "sandbox.lock"
    with pytest.raises(EnvError, match=r"sandbox.lock cannot be opened safely"), trust.locked(link):
        pass
    assert not target.exists()
    with trust.locked(tmp_path / "fresh.lock"):
        assert stat.S_IMODE((tmp_path / "fresh.lock").stat().st_mode) == 0o600


@as_root
def test_a_lock_file_another_user_made_is_refused(tmp_path: Path) -> None:
    (tmp_path / "sandbox.lock").write_text("")
    os.chown(tmp_path / "sandbox.lock", NOBODY, NOBODY)
    with pytest.raises(EnvError, match=r"sandbox.lock belongs to uid 65534"), trust.locked(tmp_path / "sandbox.lock"):
        pass
