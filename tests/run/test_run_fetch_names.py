"""`kcoral run --fetch` of outputs whose names a folder return cannot carry (CLIENT_API §11,
PROTOCOL §5.5), against a real CPU server."""

from __future__ import annotations

from pathlib import Path

import pytest

from kcoral.cli import main as kcoral_main

ODD_NAMES_TOOL = (
    "import os; os.makedirs(b'out/dir\\xfe/deep'); open(b'out/dir\\xfe/deep/x', 'w').write('x');"
    "open(b'out/bad\\xff', 'w').write('x'); open('out/back\\\\slash', 'w').write('b');"
    "os.symlink('good', b'out/link\\xfd'); open('out/good', 'w').write('G')"
)


def test_outputs_named_in_no_utf_8_or_with_a_backslash_are_named_and_the_rest_comes_back(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # One such name failed the whole run ("remote program failed (serialization): ... is not
    # a valid UTF-8 name") and every other output was lost.
    argv = ["run", "python", "--url", server_url, "--fetch", "out", "--out", "o"]
    assert kcoral_main([*argv, "--", "-c", ODD_NAMES_TOOL]) == 1
    err = capfd.readouterr().err
    assert "remote program failed" not in err
    assert "missing output out/bad\\xff: its name is not valid UTF-8; not returned" in err
    assert "missing output out/dir\\xfe: its name is not valid UTF-8; not returned" in err
    assert "missing output out/back\\slash: its name holds a backslash; not returned" in err
    assert "warning: out/link\\xfd is a symbolic link; links are not fetched" in err
    assert sorted(path.name for path in (in_tmp / "o" / "out").iterdir()) == ["good"]
    assert (in_tmp / "o/out/good").read_text() == "G"


def test_a_symbolic_link_among_the_outputs_is_said_to_be_one_and_not_fetched(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # run soak: a link read "is not a regular file or directory; not returned", true but
    # leaving the user to guess what it was, and whether links ever come back
    code = (
        "import os; os.makedirs('out'); open('out/real', 'w').write('R');"
        "os.symlink('real', 'out/link'); os.mkfifo('out/pipe'); os.symlink('out/real', 'top')"
    )
    argv = ["run", "python", "--url", server_url, "--fetch", "out", "--fetch", "top"]
    assert kcoral_main([*argv, "--out", "o", "--", "-c", code]) == 1
    assert capfd.readouterr().err.splitlines() == [
        "kcoral run: warning: out/pipe is not a regular file or directory; not returned",
        "kcoral run: warning: out/link is a symbolic link; links are not fetched",
        "kcoral run: missing output top: is a symbolic link (links are not fetched)",
    ]
    assert sorted(path.name for path in (in_tmp / "o" / "out").iterdir()) == ["real"]
