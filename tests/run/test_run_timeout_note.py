"""`kcoral run` whose tool runs past its deadline (CLIENT_API §11, SERVER §8)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from server_process import running_server

from kcoral.cli import main as kcoral_main


@pytest.mark.slow
def test_a_tool_past_its_deadline_names_the_timeout_option_that_sets_it(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # The 504 named only the server's words, "the program's timeout_seconds", which the
    # user of kcoral run never typed; then a third clause said which option it was, in a
    # line of 200 characters naming three settings.
    argv = ["--url", server_url, "--timeout", "1", "--", "-c", "import time; time.sleep(60)"]
    assert kcoral_main(["run", "python", *argv]) == 1
    assert capfd.readouterr().err == (
        "kcoral run: timed out after --timeout 1 s on the worker; the tool was stopped\n"
    )


@pytest.mark.slow
def test_a_tool_past_the_servers_most_says_its_timeout_was_cut(
    in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with running_server(
        in_tmp / "server", ["--log-dir", "", "--max-timeout-seconds", "1"]
    ) as server:
        argv = ["--url", server.url, "--timeout", "5", "--", "-c", "import time; time.sleep(60)"]
        assert kcoral_main(["run", "python", *argv]) == 1
    assert capfd.readouterr().err == (
        "kcoral run: warning: --timeout 5 is over this server's most, 1 s (kcoral server "
        "--max-timeout-seconds): the tool gets 1 s\n"
        "kcoral run: timed out after 1 s on the worker, this server's most (--timeout 5 was "
        "cut to it); the tool was stopped\n"
    )


def test_a_timeout_over_the_servers_most_is_said_before_the_run(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # The server cut --timeout 1000 to its most (900 s by default) without a word: a tool
    # learned it only when it was killed there.
    argv = ["--url", server_url, "--timeout", "1000", "--", "-c", "print('ran')"]
    assert kcoral_main(["run", "python", *argv]) == 0
    captured = capfd.readouterr()
    assert captured.out == "ran\n"
    assert captured.err == (
        "kcoral run: warning: --timeout 1000 is over this server's most, 900 s "
        "(kcoral server --max-timeout-seconds): the tool gets 900 s\n"
    )


@pytest.mark.slow
def test_a_tool_past_its_deadline_with_outputs_to_fetch_says_nothing_was_fetched(
    server_url: str, tmp_path: Path
) -> None:
    # The worker is killed at the deadline, so nothing of --fetch comes back; the line said
    # only that the tool was stopped, and the user looked for the --out it never made.
    code = "open('result.txt', 'w').write('partial'); import time; time.sleep(60)"
    command = [sys.executable, "-m", "kcoral", "run", "python", "--url", server_url]
    command += ["--timeout", "1", "--fetch", "result.txt", "--out", "got", "--", "-c", code]
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=tmp_path, stdin=subprocess.DEVNULL, timeout=100
    )
    assert done.returncode == 1
    assert done.stderr == (
        "kcoral run: timed out after --timeout 1 s on the worker; the tool was stopped, and "
        "nothing was fetched\n"
    )
    assert not (tmp_path / "got").exists()
