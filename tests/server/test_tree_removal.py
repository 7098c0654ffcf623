"""``storage.trees``: removing the trees a program shapes (audit F1), without recursion,
never following a link, never raising."""

from __future__ import annotations

import os
from pathlib import Path

from kcoral_server.storage.trees import empty_tree, remove_tree


def _deep(top: Path, levels: int) -> None:
    here = os.getcwd()
    os.chdir(top)
    try:
        for level in range(levels):
            os.mkdir("a")
            os.chdir("a")
            if level % 250 == 0:
                open("f", "w").close()
                os.mkdir("empty")
    finally:
        os.chdir(here)


def test_a_tree_deeper_than_the_recursion_limit_is_removed(tmp_path: Path) -> None:
    top = tmp_path / "top"
    top.mkdir()
    _deep(top, 3000)
    assert remove_tree(top)
    assert not top.exists()


def test_emptying_keeps_the_directory_and_removes_everything_in_it(tmp_path: Path) -> None:
    top = tmp_path / "top"
    top.mkdir()
    _deep(top, 1200)
    (top / "file").write_text("x")
    (top / "wide").mkdir()
    for index in range(300):
        (top / "wide" / str(index)).mkdir()
        (top / "wide" / str(index) / "f").write_text("x")
    assert empty_tree(top)
    assert top.is_dir() and os.listdir(top) == []


def test_links_in_the_tree_are_removed_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "inner").mkdir(parents=True)
    (outside / "keep").write_text("kept")
    top = tmp_path / "top"
    (top / "sub").mkdir(parents=True)
    (top / "sub" / "to-dir").symlink_to(outside)
    (top / "to-file").symlink_to(outside / "keep")
    (top / "dangling").symlink_to(tmp_path / "nothing")
    assert remove_tree(top)
    assert not top.exists()
    assert (outside / "keep").read_text() == "kept" and (outside / "inner").is_dir()
    link = tmp_path / "link-to-dir"
    link.symlink_to(outside)
    assert not empty_tree(link)  # a link is not the directory to empty
    assert remove_tree(link) and not link.is_symlink()
    assert (outside / "keep").read_text() == "kept"


def test_directories_whose_permissions_were_taken_away_are_removed(tmp_path: Path) -> None:
    top = tmp_path / "top"
    (top / "closed" / "inner").mkdir(parents=True)
    (top / "closed" / "inner" / "f").write_text("x")
    os.chmod(top / "closed" / "inner", 0)
    os.chmod(top / "closed", 0)
    assert remove_tree(top)
    assert not top.exists()


def test_a_missing_path_is_already_gone(tmp_path: Path) -> None:
    assert remove_tree(tmp_path / "missing")
    assert not empty_tree(tmp_path / "missing")
