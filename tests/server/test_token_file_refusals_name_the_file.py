"""``kcoral server --auth-token-file PATH`` refuses a token file it cannot use in one line
that names the option, the file and the problem, and exits 2 (EXTENSIONS §6), run as the
README runs it. Before, the line named only the option (``--auth-token-file is empty``),
while the README said it names the file. A path that does not exist and may be the token
itself, pasted where its file goes, is still never shown."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RUN_SECONDS = 120.0


def refusal(directory: Path, token_file: str) -> str:
    """What ``kcoral server --auth-token-file TOKEN_FILE`` says as it refuses to start, run
    in ``directory``; it must exit 2 with one line after its usage."""
    argv = [sys.executable, "-m", "kcoral", "server", "--port", "0", "--device", "cpu"]
    argv += ["--log-dir", str(directory / "logs"), "--auth-token-file", token_file]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCORAL_")}
    done = subprocess.run(
        argv, cwd=directory, env=env, capture_output=True, text=True, timeout=RUN_SECONDS
    )
    assert done.returncode == 2, done.stderr
    usage, said = done.stderr.strip().splitlines()
    assert usage.startswith("usage: kcoral server"), done.stderr
    return said.removeprefix("kcoral server: error: ")


def written(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o600)
    return path.name  # relative, as the README gives it


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda d: written(d / "client.token", ""), "client.token is empty"),
        (lambda d: written(d / "client.token", "  \n\n"), "client.token is empty"),
        (
            lambda d: written(d / "client.token", "alice tok extra\n"),
            "client.token, line 1: expected 'NAME TOKEN' or 'NAME TOKEN admin'",
        ),
        (
            lambda d: written(d / "client.token", "alice t\x01k\n"),
            "client.token, line 1: the token of 'alice' is not printable ASCII",
        ),
        (lambda d: (d / "tokens").mkdir() or "tokens", "tokens cannot be read: Is a directory"),
        (
            lambda d: "client.token",
            "client.token cannot be read: No such file or directory (it names a file holding "
            "the token; KCORAL_AUTH_TOKEN takes the token itself)",
        ),
        (
            lambda d: str(d / "missing"),
            "{dir}/missing cannot be read: No such file or directory",
        ),
    ],
    ids=["empty", "blank", "bad-line", "control-character", "a-folder", "missing", "missing-path"],
)
def test_a_token_file_the_server_cannot_use_is_named_with_its_problem(
    tmp_path: Path, make, problem: str
) -> None:
    said = refusal(tmp_path, make(tmp_path))
    assert said.startswith("--auth-token-file " + problem.format(dir=tmp_path)), said


def test_a_token_pasted_where_its_file_goes_is_still_never_shown(tmp_path: Path) -> None:
    for pasted in ("mT4q0ZcW1xKJv9uYp2Lr8sNd3Ao7Hf6Ge5Bi0Ck1Dj", "eyJhbGciOi/x+Yz=="):
        said = refusal(tmp_path, pasted)
        assert pasted not in said and "eyJ" not in said, said
        assert said.startswith("--auth-token-file cannot be read: No such file or directory")
