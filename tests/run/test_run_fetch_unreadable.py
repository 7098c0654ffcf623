"""`kcoral run --fetch` of outputs the tool made unreadable (CLIENT_API §11), against a real
CPU server. Root reads a mode-000 directory anyway, so these run where permissions hold
(tests/test_ci_required.py runs them again without CAP_DAC_OVERRIDE)."""

from __future__ import annotations

from pathlib import Path

import pytest
from file_permissions import needs_file_permissions

from kcoral.cli import main as kcoral_main

pytestmark = [needs_file_permissions, pytest.mark.file_permissions]

LOCKING_TOOL = (
    "import os; os.makedirs('out/locked'); os.makedirs('out/ok');"
    "open('out/locked/inside', 'w').write('L'); open('out/ok/f', 'w').write('F');"
    "open('out/secret', 'w').write('S'); open('out/z', 'w').write('Z');"
    "os.chmod('out/locked', 0); os.chmod('out/secret', 0)"
)


def test_an_unreadable_directory_in_a_fetched_folder_is_named_and_the_rest_comes_back(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "python", "--url", server_url, "--fetch", "out", "--out", "o"]
    assert kcoral_main([*argv, "--", "-c", LOCKING_TOOL]) == 1
    err = capfd.readouterr().err
    assert "Traceback" not in err
    assert "missing output out/locked: Permission denied" in err
    assert "missing output out/secret: Permission denied" in err
    assert "missing output out:" not in err  # the fetched folder itself came back
    assert (in_tmp / "o/out/ok/f").read_text() == "F"  # sorted after 'locked'
    assert (in_tmp / "o/out/z").read_text() == "Z"
    assert not (in_tmp / "o/out/locked").exists()
    assert not (in_tmp / "o/out/secret").exists()


def test_an_unreadable_entry_the_tool_left_among_the_outputs_fails_clearly_not_with_a_traceback(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # What run-iket writes goes straight into the outputs directory, as this tool's does.
    code = (
        "import os; os.makedirs('../outputs/empty'); os.makedirs('../outputs/full');"
        "open('../outputs/full/x', 'w').write('X'); os.chmod('../outputs/empty', 0);"
        "os.chmod('../outputs/full', 0); os.makedirs('out')"
    )
    argv = ["run", "python", "--url", server_url, "--fetch", "out", "--out", "o"]
    assert kcoral_main([*argv, "--", "-c", code]) == 1
    err = capfd.readouterr().err
    assert "Traceback" not in err
    # named as --fetch names paths (f7c89dc), and the run says nothing was saved
    assert "the outputs were not fetched: cannot read 'full': Permission denied" in err


def test_an_empty_unreadable_directory_among_the_outputs_is_dropped_and_named_whatever_its_name(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code = (
        "import os; os.makedirs('../outputs/empty'); os.makedirs(b'../outputs/e\\xff');"
        "os.chmod('../outputs/empty', 0); os.chmod(b'../outputs/e\\xff', 0);"
        "os.makedirs('out'); open('out/good', 'w').write('G')"
    )
    argv = ["run", "python", "--url", server_url, "--fetch", "out", "--out", "o"]
    assert kcoral_main([*argv, "--", "-c", code]) == 1
    err = capfd.readouterr().err
    assert "remote program failed" not in err
    assert "missing output empty: Permission denied" in err
    assert "missing output e\\xff: its name is not valid UTF-8; not returned" in err
    assert (in_tmp / "o/out/good").read_text() == "G"
