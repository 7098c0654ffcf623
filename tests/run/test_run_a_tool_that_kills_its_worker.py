"""`kcoral run` of a tool that kills the worker running it (CLIENT_API §11): the line says
so in the tool's words, where it said the server's ("worker exited while executing the
instruction"), which named no tool and left the user to guess what a worker and an
instruction were."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_process import running_server


@pytest.fixture(scope="module")
def server_and_token(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A CPU server started as the README starts one, with a token file, and its token."""
    directory = tmp_path_factory.mktemp("worker-killed")
    token = "a-token-for-this-test-only"
    token_file = directory / "client.token"
    token_file.write_text(token + "\n", encoding="utf-8")
    token_file.chmod(0o600)
    with running_server(directory, ["--auth-token-file", str(token_file)]) as server:
        yield server.url, token


def kcoral_run(server: tuple[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    """`kcoral run ARGV` as a user types it, KCORAL_URL and KCORAL_TOKEN exported."""
    url, token = server
    env = {**os.environ, "KCORAL_URL": url, "KCORAL_TOKEN": token}
    command = [sys.executable, "-m", "kcoral", "run", *argv]
    return subprocess.run(
        command, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=100
    )


def the_line_without_its_request_id(stderr: str) -> str:
    """The last line on stderr, its `[request ID]` (a fresh id every run) cut off."""
    line = stderr.splitlines()[-1]
    assert line.endswith("]") and " [request " in line, stderr
    return line.rsplit(" [request ", 1)[0]


def test_a_tool_that_kills_its_parent_is_said_to_have_killed_the_worker_running_it(
    server_and_token: tuple[str, str], tmp_path: Path
) -> None:
    script = "echo before; kill -9 $PPID; sleep 5; echo after"
    done = kcoral_run(server_and_token, "shell", "--", "sh", "-c", script)
    assert done.returncode == 1, done.stderr
    assert done.stdout == "before\n"  # what it printed first is kept
    assert the_line_without_its_request_id(done.stderr) == (
        "kcoral run: the worker running the tool died mid-run (did the tool kill its parent "
        "or its process group?); the tool's exit status is lost"
    )


def test_a_worker_death_the_server_explains_keeps_the_servers_cause(
    server_and_token: tuple[str, str], tmp_path: Path
) -> None:
    code = "import os, signal; os.kill(os.getppid(), signal.SIGTERM)"
    done = kcoral_run(server_and_token, "python", "--", "-c", code)
    assert done.returncode == 1, done.stderr
    assert the_line_without_its_request_id(done.stderr) == (
        "kcoral run: the worker running the tool died mid-run: killed by SIGTERM, which the "
        "server did not send (the program's own, or a scheduler or kill that stopped every "
        "process of the server?); the tool's exit status is lost"
    )


def test_a_tool_that_kills_itself_still_exits_128_plus_the_signal(
    server_and_token: tuple[str, str], tmp_path: Path
) -> None:
    done = kcoral_run(server_and_token, "shell", "--", "sh", "-c", "kill -9 $$")
    assert done.returncode == 128 + 9, done.stderr
    assert done.stderr == "kcoral run: the tool was killed by SIGKILL (signal 9)\n"
