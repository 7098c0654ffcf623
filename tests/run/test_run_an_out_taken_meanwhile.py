"""`kcoral run --out DIR` whose DIR another run made while this one's tool ran (CLIENT_API
§11): the save fails and says so, and the run still exits as its tool did. It exited 1, so
a tool's status 3 read as 1 (the line about the save is what says the outputs were lost)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from run_as_a_user import ServerWithAToken, kcoral_run, server_with_a_token


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerWithAToken]:
    """Two workers without a sandbox: the two tools see this machine's files, so the one
    that finishes second waits for the first run's save."""
    directory = tmp_path_factory.mktemp("out-taken")
    with server_with_a_token(directory, ["--num-workers", "2", "--sandbox", "none"]) as started:
        yield started


def tool_that(wait_for_path: Path, then_touch: Path | None = None) -> str:
    """A tool that writes result.txt (and touches ``then_touch``), waits for
    ``wait_for_path`` and exits 3."""
    touch = f"open({str(then_touch)!r}, 'w').close()\n" if then_touch else ""
    return (
        "import os, time\n"
        "open('result.txt', 'w').write('mine')\n"
        f"{touch}"
        f"while not os.path.exists({str(wait_for_path)!r}):\n"
        "    time.sleep(0.05)\n"
        "raise SystemExit(3)\n"
    )


def test_an_out_another_run_made_meanwhile_fails_the_save_and_the_tools_status_stays(
    server: ServerWithAToken, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    second_started = tmp_path / "second-started"
    # the first run's tool waits for the second's to start, so both checked --out before
    # either saved; the second's tool waits for the first run's save
    first_code = tool_that(wait_for_path=second_started)
    second_code = tool_that(wait_for_path=out / "result.txt", then_touch=second_started)
    argv = ["python", "--fetch", "result.txt", "--out", str(out), "--", "-c"]
    first = subprocess.Popen(
        [sys.executable, "-m", "kcoral", "run", *argv, first_code],
        env={**os.environ, "KCORAL_URL": server.url, "KCORAL_TOKEN": server.token},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        second = kcoral_run(server, *argv, second_code, cwd=tmp_path)
        _, first_err = first.communicate(timeout=100)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert (first.returncode, first_err) == (3, "")
    assert (out / "result.txt").read_text() == "mine"
    assert second.returncode == 3, second.stderr
    assert second.stderr == (
        f"kcoral run: cannot save the outputs to {str(out)!r}: {str(out)!r} already exists\n"
    )
