"""`kcoral run` of a tool that kills the worker running it (CLIENT_API §11): the line says
so in the tool's words, where it said the server's ("worker exited while executing the
instruction"), which named no tool and left the user to guess what a worker and an
instruction were."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from run_as_a_user import ServerWithAToken, kcoral_run, server_with_a_token


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerWithAToken]:
    with server_with_a_token(tmp_path_factory.mktemp("worker-killed")) as started:
        yield started


def the_line_without_its_request_id(stderr: str) -> str:
    """The last line on stderr, its `[request ID]` (a fresh id every run) cut off."""
    line = stderr.splitlines()[-1]
    assert line.endswith("]") and " [request " in line, stderr
    return line.rsplit(" [request ", 1)[0]


def test_a_tool_that_kills_its_parent_is_said_to_have_killed_the_worker_running_it(
    server: ServerWithAToken,
) -> None:
    script = "echo before; kill -9 $PPID; sleep 5; echo after"
    done = kcoral_run(server, "shell", "--", "sh", "-c", script)
    assert done.returncode == 1, done.stderr
    assert done.stdout == "before\n"  # what it printed first is kept
    assert the_line_without_its_request_id(done.stderr) == (
        "kcoral run: the worker running the tool died mid-run (did the tool kill its parent "
        "or its process group?); the tool's exit status is lost"
    )


def test_a_worker_death_the_server_explains_keeps_the_servers_cause(
    server: ServerWithAToken,
) -> None:
    code = "import os, signal; os.kill(os.getppid(), signal.SIGTERM)"
    done = kcoral_run(server, "python", "--", "-c", code)
    assert done.returncode == 1, done.stderr
    assert the_line_without_its_request_id(done.stderr) == (
        "kcoral run: the worker running the tool died mid-run: killed by SIGTERM, which the "
        "server did not send (the program's own, or a scheduler or kill that stopped every "
        "process of the server?); the tool's exit status is lost"
    )


def test_a_tool_that_kills_itself_still_exits_128_plus_the_signal(server: ServerWithAToken) -> None:
    done = kcoral_run(server, "shell", "--", "sh", "-c", "kill -9 $$")
    assert done.returncode == 128 + 9, done.stderr
    assert done.stderr == "kcoral run: the tool was killed by SIGKILL (signal 9)\n"
