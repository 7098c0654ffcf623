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
