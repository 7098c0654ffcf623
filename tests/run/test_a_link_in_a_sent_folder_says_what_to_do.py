"""``kcoral run --send .`` with a symbolic link below the folder names the link, where it
points and what to do; links stay refused (one could point outside the folder).

Before, the whole send was refused with "'./data/big' is a symbolic link; refused": no word
of why, nor of a way to send the project. ``Program.upload_folder`` says the same in its own
words.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kcoral.cli import main as kcoral_main
from kcoral.local_folder import LinkRefused
from kcoral.program import Program


def a_project_with_a_link(root: Path) -> Path:
    (root / "data").mkdir(parents=True)
    (root / "main.py").write_text("print('hi')\n")
    (root / "data" / "big").symlink_to("/etc/passwd")
    return root


def test_kcoral_run_names_the_link_its_target_and_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(a_project_with_a_link(tmp_path / "project"))
    monkeypatch.setenv("KCORAL_TOKEN", "unused-nothing-is-sent")
    status = kcoral_main(
        ["run", "python", "--url", "http://127.0.0.1:9", "--send", ".", "--", "main.py"]
    )
    assert status == 1
    assert capsys.readouterr().err == (
        "kcoral run: --send: './data/big' is a symbolic link (to '/etc/passwd'); links are "
        "refused, as one could point outside the folder: send the folder without it, or what "
        "it points to with a --send of its own\n"
    )


def test_upload_folder_names_the_link_in_its_own_words(tmp_path: Path) -> None:
    project = a_project_with_a_link(tmp_path / "project")
    program = Program()
    with pytest.raises(LinkRefused) as info:
        program.upload_folder(project, path="project")
    assert str(info.value) == (
        f"'{project}/data/big' is a symbolic link (to '/etc/passwd'); links are refused, as "
        "one could point outside the folder: upload the folder without it, or what it points "
        "to by its own path"
    )
    assert isinstance(info.value, ValueError)  # as CLIENT_API §3.3 documents
    assert program.instructions == []


def test_a_link_whose_target_cannot_be_read_is_still_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = a_project_with_a_link(tmp_path / "project")

    def unreadable(*args: object, **kwargs: object) -> str:
        raise PermissionError("no")

    monkeypatch.setattr(os, "readlink", unreadable)
    with pytest.raises(LinkRefused, match=r"^'.*/data/big' is a symbolic link; links are refused"):
        Program().upload_folder(project, path="project")


def test_a_link_given_to_send_itself_says_to_send_what_it_points_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "--send 'alias': symbolic link cannot be sent", no way out named.
    project = a_project_with_a_link(tmp_path / "project")
    monkeypatch.chdir(tmp_path)
    os.symlink(project, tmp_path / "alias")
    monkeypatch.setenv("KCORAL_TOKEN", "unused-nothing-is-sent")
    status = kcoral_main(
        ["run", "python", "--url", "http://127.0.0.1:9", "--send", "alias", "--", "main.py"]
    )
    assert status == 1
    assert capsys.readouterr().err == (
        f"kcoral run: --send 'alias': a symbolic link (to '{project}') is not sent; give "
        f"--send '{project}' instead\n"
    )
