"""`kcoral run` handed standard input, which it does not send (CLIENT_API §11)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

READS_ITS_INPUT = "import sys; print(repr(sys.stdin.read()))"
WARNING = (
    "kcoral run: warning: standard input is not sent: the remote tool reads an empty one"
    " (--send FILE uploads a file the tool can open)\n"
)


def _kcoral_run(server_url: str, stdin: int) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "kcoral", "run", "python", "--url", server_url]
    return subprocess.run(
        [*command, "--", "-c", READS_ITS_INPUT],
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_data_piped_into_kcoral_run_is_said_to_be_left_behind(
    server_url: str, in_tmp: Path
) -> None:
    # `cat data.csv | kcoral run python -- process.py` ran the script on an empty input
    # without a word: its output looked like the data's.
    read_end, write_end = os.pipe()
    os.write(write_end, b"a,b\n1,2\n")
    os.close(write_end)
    try:
        done = _kcoral_run(server_url, read_end)
    finally:
        os.close(read_end)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "''\n"
    assert done.stderr == WARNING


@pytest.mark.slow
def test_a_file_redirected_into_kcoral_run_is_said_to_be_left_behind(
    server_url: str, in_tmp: Path
) -> None:
    (in_tmp / "data.csv").write_text("a,b\n1,2\n")
    with open(in_tmp / "data.csv", "rb") as data:
        done = _kcoral_run(server_url, data.fileno())
    assert done.returncode == 0, done.stderr
    assert done.stderr == WARNING


@pytest.mark.slow
def test_no_input_or_an_empty_one_draws_no_warning(server_url: str, in_tmp: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(write_end)  # an empty pipe: `true | kcoral run ...`
    try:
        for stdin in (subprocess.DEVNULL, read_end):
            done = _kcoral_run(server_url, stdin)
            assert done.returncode == 0, done.stderr
            assert (done.stdout, done.stderr) == ("''\n", "")
    finally:
        os.close(read_end)
