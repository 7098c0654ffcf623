"""What `kcoral run` can tell is wrong before it sends anything (CLIENT_API §11), against a
real CPU server: each of these ran the tool, or sent the inputs, and only then failed in
words that named the wrong thing."""

from __future__ import annotations

from pathlib import Path

import pytest

from kcoral.cli import main as kcoral_main


def run(url: str, tool: str, *argv: str) -> int:
    """`kcoral run TOOL --url URL ARGV...` in this process; returns the exit status."""
    return kcoral_main(["run", tool, "--url", url, *argv])


def test_the_same_input_sent_twice_is_said_to_be_given_twice(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # run soak: "--send: two inputs would both be sent as 'bench/main.py'", as if two
    # different inputs clashed
    (in_tmp / "bench").mkdir()
    (in_tmp / "bench" / "main.py").write_text("print('ran')")
    assert (
        run(server_url, "python", "--send", "bench", "--send", "bench", "--", "bench/main.py") == 1
    )
    assert capfd.readouterr() == ("", "kcoral run: --send: 'bench' is given twice; give it once\n")
    assert run(server_url, "python", "--send", "bench", "--send", "./bench/", "--", "-c", "1") == 1
    assert capfd.readouterr().err == (
        "kcoral run: --send: 'bench' and './bench/' name the same input; give it once\n"
    )


@pytest.mark.parametrize(
    "command",
    [
        ["ncu", "--out", "o", "--", "--", "./tools/app"],
        ["run-iket", "--out", "o", "--", "profile", "--", "./tools/app"],
        ["compute-sanitizer", "--", "./tools/app"],
    ],
    ids=lambda command: command[0],
)
def test_a_profilers_app_sent_without_its_executable_bit_is_refused_before_sending(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str], command: list[str]
) -> None:
    # run soak: the check covered `shell` alone, and these tools failed on the worker
    # after the upload ("./tools/app: Permission denied", or their own words for it)
    tool, *argv = command
    (in_tmp / "tools").mkdir()
    app = in_tmp / "tools" / "app"
    app.write_text("#!/bin/sh\necho ran\n")
    app.chmod(0o644)
    assert run(server_url, tool, "--send", "tools", *argv) == 2
    assert capfd.readouterr() == (
        "",
        f"kcoral run: {tool}: ./tools/app cannot run: it is sent without its executable bit; "
        "chmod +x it here\n",
    )
    assert not (in_tmp / "o").exists()
    app.chmod(0o755)  # sent now, to a CPU server that has no such tool
    assert run(server_url, tool, "--send", "tools", *argv) == 1
    assert f"{tool} is not installed in the remote server environment" in capfd.readouterr().err


def test_an_out_that_cannot_be_created_is_refused_before_the_tool_runs(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # run soak, as root: the bits of /proc let root write, so the tool ran and the save
    # then failed with "[Errno 2] No such file or directory: 'x'", its outputs lost
    ran = in_tmp / "ran"
    code = f"open('x', 'w').write('x'); open({str(ran)!r}, 'w').write('ran')"
    assert run(server_url, "python", "--fetch", "x", "--out", "/proc/x", "--", "-c", code) == 2
    first = capfd.readouterr().err.splitlines()[0]
    assert first.startswith("kcoral run: error: --out '/proc/x': cannot create ")
    assert "Errno" not in first
    assert not ran.exists()


def test_an_out_that_can_be_made_is_left_unmade_until_something_comes_back(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # the check makes --out and a file in it, then removes both: a run whose outputs are
    # all missing still leaves no empty --out behind
    argv = ["--fetch", "absent", "--out", "a/b/o", "--", "-c", "pass"]
    assert run(server_url, "python", *argv) == 1
    assert "missing output absent: not found" in capfd.readouterr().err
    assert list(in_tmp.iterdir()) == []
    argv = ["--fetch", "x", "--out", "a/b/o", "--", "-c", "open('x', 'w').write('X')"]
    assert run(server_url, "python", *argv) == 0
    assert (in_tmp / "a/b/o/x").read_text() == "X"
