"""Attack: a program leaves a directory tree too deep for a recursive removal (audit F1).

A program of any token holder made a 1500-level tree in its workspace. The front-end's
``shutil.rmtree`` raised ``RecursionError`` when it emptied the seat's sandbox directory for
the next worker: the error escaped the spare's start, the seat never got a worker again and
every later request of every identity waited 30 minutes for a 503; the tree stayed on disk.
Without a sandbox the planting program's own request got a 500 and its workspace leaked.
Each test plants the tree against a real server with real workers, then runs programs of
the same and of another identity on that one seat, and finds the tree gone.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from identity_support import TOKEN_A, TOKEN_B, TOKEN_LINES, request, token_file
from kcoral_server.processes import sandbox
from kcoral_server.storage.trees import remove_tree
from raw_http import call_program, post_execute

BWRAP_PROBLEM = sandbox.probe()
SANDBOXES = [
    "none",
    pytest.param(
        "bubblewrap",
        marks=pytest.mark.skipif(
            BWRAP_PROBLEM is not None, reason=f"bubblewrap cannot run here: {BWRAP_PROBLEM}"
        ),
    ),
]
LEVEL = "kcoral-deep-level"
PLANT = f"""
import os

def main():
    for _ in range(1500):
        os.mkdir({LEVEL!r})
        os.chdir({LEVEL!r})
    return "planted"
"""
TRIVIAL = "def main():\n    return 'ran'\n"
#: far below the 30 minutes a request waited for a seat that lost its worker for good
ANSWER_WITHIN_SECONDS = 120.0


def _run(url: str, source: str, token: str) -> dict:
    answer = post_execute(
        url,
        call_program(source),
        headers={"Authorization": f"Bearer {token}"},
        timeout=ANSWER_WITHIN_SECONDS,
    )
    assert answer.status == 200, answer.raw[:2000]
    return answer.body


def _value(answer: dict) -> object:
    assert answer["status"] == "COMPLETED", answer
    return answer["results"]["value"]["value"]


def _capacity(url: str) -> int:
    return request(url, "GET", "/health", TOKEN_A).json["load"]["request_capacity"]


def _levels_left(temp: Path) -> list[str]:
    """Paths of the planted tree's directories still under the server's temporary folder."""
    found = subprocess.run(
        ["find", str(temp), "-name", LEVEL, "-print", "-quit"],
        capture_output=True,
        text=True,
        check=False,
    )
    return found.stdout.split()


@pytest.mark.parametrize("sandbox_mode", SANDBOXES)
@pytest.mark.parametrize("per_worker", ["1", "0"], ids=["one-shot", "reused"])
def test_a_program_that_leaves_a_1500_level_tree_stops_no_seat_and_the_tree_goes(
    server_factory, tmp_path: Path, sandbox_mode: str, per_worker: str
) -> None:
    temp = tmp_path / "temp"  # the server's workspaces and sandbox directories
    temp.mkdir()
    tokens = token_file(tmp_path / "secrets", TOKEN_LINES)
    server = server_factory(
        "--auth-token-file",
        str(tokens),
        "--sandbox",
        sandbox_mode,
        "--num-workers",
        "1",
        "--max-requests-per-worker",
        per_worker,
        env={"TMPDIR": str(temp)},
    )
    try:
        assert _value(_run(server.url, PLANT, TOKEN_B)) == "planted"
        # each of the seat's workers (and both sandbox directories of a one-shot seat) after it
        for _ in range(3):
            assert _value(_run(server.url, TRIVIAL, TOKEN_B)) == "ran"
        for _ in range(3):
            assert _value(_run(server.url, TRIVIAL, TOKEN_A)) == "ran"
        deadline = time.monotonic() + ANSWER_WITHIN_SECONDS
        while (left := _levels_left(temp)) and time.monotonic() < deadline:
            time.sleep(0.2)  # a one-shot seat empties the last directory after the answer
        assert left == [], left
        while (capacity := _capacity(server.url)) != 1 and time.monotonic() < deadline:
            time.sleep(0.2)  # a one-shot seat's next worker may still be taking over
        assert capacity == 1
        assert "RecursionError" not in server.stderr()
        assert "Task exception was never retrieved" not in server.stderr()
    finally:
        server.stop()
        remove_tree(temp)  # pytest's own clean-up recurses: a tree left by a failure
