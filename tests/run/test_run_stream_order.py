"""The order of a tool's stdout and stderr where the user reads both in one place (a
terminal, ``2>&1``): as the tool wrote them (CLIENT_API §11). The server follows each
stream's capture on its own, so ``echo out1; echo err1 >&2; echo out2`` showed ``out1 out2
err1``, and a traceback came apart from the lines printed before it.

A real server as the README starts one: tokens on, the default sandbox.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_process import client_token_file, running_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TOKEN = "token-stream-order-0123456789"
SCRIPT = "echo out1; echo err1 >&2; echo out2; echo err2 >&2; exit 4"


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("stream-order")
    tokens = client_token_file(directory, f"{TOKEN}\n")
    args = ["--log-dir", "", "--auth-token-file", str(tokens), "--sandbox", "auto"]
    with running_server(directory / "server", args) as running:
        yield running.url


def _run(server_url: str, cwd: Path, stderr: int) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "kcoral", "run", "shell", "--url", server_url, "--",
               "sh", "-c", SCRIPT]  # fmt: skip
    return subprocess.run(
        command,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env={**os.environ, "KCORAL_TOKEN": TOKEN},
        cwd=cwd,
        timeout=120,
    )


def test_stdout_and_stderr_read_in_one_place_keep_the_order_the_tool_wrote(
    server_url: str, tmp_path: Path
) -> None:
    ran = _run(server_url, tmp_path, subprocess.STDOUT)
    assert (ran.stdout, ran.returncode) == ("out1\nerr1\nout2\nerr2\n", 4)


def test_stdout_and_stderr_read_apart_stay_apart(server_url: str, tmp_path: Path) -> None:
    ran = _run(server_url, tmp_path, subprocess.PIPE)
    assert (ran.stdout, ran.stderr, ran.returncode) == ("out1\nout2\n", "err1\nerr2\n", 4)


def test_output_that_is_not_utf8_arrives_with_replacement_characters(
    server_url: str, tmp_path: Path
) -> None:
    # As the README says: output travels as text (PROTOCOL §7), UTF-8 byte for byte.
    command = [sys.executable, "-m", "kcoral", "run", "shell", "--url", server_url, "--",
               "printf", "caf\\303\\251 \\377 ok\\n"]  # fmt: skip
    ran = subprocess.run(
        command,
        capture_output=True,
        env={**os.environ, "KCORAL_TOKEN": TOKEN},
        cwd=tmp_path,
        timeout=120,
    )
    assert (ran.stdout, ran.stderr, ran.returncode) == ("café \ufffd ok\n".encode(), b"", 0)
