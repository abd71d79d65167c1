"""safefiles: files created in folders others may write, never through a symbolic link planted there."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchslurm.errors import TorchSlurmError
from torchslurm.runtime.safefiles import open_append, open_new, open_write, replace


@pytest.fixture
def planted(tmp_path: Path) -> tuple[Path, Path]:
    """(a link, the file it points to, which must never change)."""
    target = tmp_path / "target"
    target.write_text("keep me")
    link = tmp_path / "link"
    link.symlink_to(target)
    return link, target


def test_a_new_file_is_not_created_where_anything_is(planted: tuple[Path, Path]) -> None:
    link, target = planted
    with pytest.raises(FileExistsError):
        open_new(link)
    with open_new(link.with_name("fresh"), "wb") as out:
        out.write(b"x")
    assert link.with_name("fresh").read_bytes() == b"x" and target.read_text() == "keep me"


@pytest.mark.parametrize("opening", [open_write, open_append])
def test_writing_through_a_planted_link_is_a_clear_error(planted: tuple[Path, Path], opening: object) -> None:
    link, target = planted
    with pytest.raises(TorchSlurmError, match=r"link is a symbolic link; torchslurm writes its own files there .*"
                                              r"HINT: remove the link \(rm .*link\); if you did not make it"):
        opening(link)  # type: ignore[operator]
    assert target.read_text() == "keep me"


def test_writing_and_appending_create_or_reuse_a_plain_file(tmp_path: Path) -> None:
    with open_write(tmp_path / "f") as out:
        out.write("one\n")
    with open_append(tmp_path / "f") as out:
        out.write("two\n")
    with open_write(tmp_path / "f") as out:
        out.write("three\n")
    assert (tmp_path / "f").read_text() == "three\n"


def test_replace_swaps_the_link_itself_never_its_target(planted: tuple[Path, Path]) -> None:
    link, target = planted
    replace(link, "new")
    assert not link.is_symlink() and link.read_text() == "new" and target.read_text() == "keep me"
    replace(link, b"bytes")
    assert link.read_bytes() == b"bytes"
    assert sorted(p.name for p in link.parent.iterdir()) == ["link", "target"]  # no staging file left
