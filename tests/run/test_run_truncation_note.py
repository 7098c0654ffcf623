"""`kcoral run`'s note on output cut at a limit (CLIENT_API §11): the limit that applied."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_process import running_server

from kcoral.cli import main as kcoral_main


@pytest.fixture(scope="module")
def small_output_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A CPU server that keeps at most 4 KiB of each stream, whatever a program asks."""
    directory = tmp_path_factory.mktemp("truncation-server")
    with running_server(directory, ["--log-dir", "", "--max-output-limit-bytes", "4K"]) as server:
        yield server.url


def test_output_cut_by_the_servers_most_names_that_limit_and_its_server_flag(
    small_output_server: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # The server clamps --output-limit-bytes (default 256 MiB) to its own most (default
    # 16 MiB): the note said "(see --output-limit-bytes)", and raising it changed nothing.
    code = "print('x' * 10000, end='')"
    argv = ["--url", small_output_server, "--output-limit-bytes", "100000", "--", "-c", code]
    assert kcoral_main(["run", "python", *argv]) == 0
    captured = capfd.readouterr()
    assert captured.out == "x" * 4096
    assert captured.err == (
        "kcoral run: the remote stdout was truncated at 4.0 KiB, the most this server keeps "
        "per stream (kcoral server --max-output-limit-bytes)\n"
    )


def test_an_output_limit_in_units_is_taken_as_the_servers_size_options_take_it(
    small_output_server: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # `--output-limit-bytes 1K` was refused ("must be a positive integer") where
    # `kcoral server --max-output-limit-bytes 4K` is the server's own way to say a size.
    code = "print('x' * 10000, end='')"
    argv = ["--url", small_output_server, "--output-limit-bytes", "1K", "--", "-c", code]
    assert kcoral_main(["run", "python", *argv]) == 0
    captured = capfd.readouterr()
    assert captured.out == "x" * 1024
    assert captured.err == (
        "kcoral run: the remote stdout was truncated at 1.0 KiB per stream (--output-limit-bytes)\n"
    )


@pytest.mark.parametrize("size", ["0", "0K", "0MB", "-1K", "1.5M", "lots"])
def test_an_output_limit_that_is_no_size_above_0_says_what_a_size_is_and_nothing_runs(
    small_output_server: str, in_tmp: Path, capfd: pytest.CaptureFixture[str], size: str
) -> None:
    argv = ["--url", small_output_server, "--output-limit-bytes", size, "--", "-c", "1"]
    assert kcoral_main(["run", "python", *argv]) == 2
    assert capfd.readouterr().err.splitlines()[0] == (
        "kcoral run: error: --output-limit-bytes must be a size above 0, in bytes or with "
        f"K, M, G or T (binary): 64K, 16M; not {size!r}"
    )


def test_a_note_after_stderr_cut_mid_line_starts_on_a_line_of_its_own(
    small_output_server: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # The cut falls mid-line, and the note continued the tool's last line:
    # "err 13kcoral run: the remote stderr was truncated ...".
    code = "import sys; sys.stderr.write('y' * 10000)"
    argv = ["--url", small_output_server, "--output-limit-bytes", "1000", "--", "-c", code]
    assert kcoral_main(["run", "python", *argv]) == 0
    captured = capfd.readouterr()
    assert captured.err == (
        "y" * 1000 + "\nkcoral run: the remote stderr was truncated at 1000 B per stream "
        "(--output-limit-bytes)\n"
    )


def test_a_note_after_stdout_cut_mid_line_on_a_terminal_starts_on_a_line_of_its_own(
    small_output_server: str, in_tmp: Path
) -> None:
    # A terminal shows both streams: the note on stderr continued the tool's cut stdout
    # line, "xxxxkcoral run: the remote stdout was truncated ...". One capture holds both
    # there (35aa63d), and the note says so: it read "the remote stdout was truncated".
    code = "print('x' * 5000, end='')"
    command = [sys.executable, "-m", "kcoral", "run", "python", "--url", small_output_server]
    command += ["--output-limit-bytes", "1000", "--", "-c", code]
    terminal, side = pty.openpty()
    with subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=side, stderr=side) as child:
        os.close(side)
        shown = b""
        while chunk := _read_or_end(terminal):
            shown += chunk
        assert child.wait() == 0
    os.close(terminal)
    assert shown == (
        b"x" * 1000 + b"\r\nkcoral run: the remote stdout and stderr, captured together, were "
        b"truncated at 1000 B (--output-limit-bytes)\r\n"
    )


def test_output_cut_with_both_streams_in_one_place_says_both_were_cut(
    small_output_server: str, in_tmp: Path
) -> None:
    # `2>&1`: the tool's stderr shares the one capture, and the cut fell in it; the note
    # named only "the remote stdout", and the stderr lost with it went unsaid.
    code = "import sys; print('x' * 3000, flush=True); sys.stderr.write('y' * 3000)"
    command = [sys.executable, "-m", "kcoral", "run", "python", "--url", small_output_server]
    command += ["--", "-c", code]
    done = subprocess.run(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert done.returncode == 0
    assert done.stdout == (
        b"x" * 3000 + b"\n" + b"y" * 1095 + b"\nkcoral run: the remote stdout and stderr, "
        b"captured together, were truncated at 4.0 KiB, the most this server keeps per "
        b"stream (kcoral server --max-output-limit-bytes)\n"
    )


def _read_or_end(terminal: int) -> bytes:
    """The next bytes a terminal shows; b"" once its other side is closed (EIO on Linux)."""
    try:
        return os.read(terminal, 65536)
    except OSError:
        return b""


def test_the_help_says_the_server_clamps_the_output_limit_and_the_timeout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The help gave 268435456 as the output limit, where a default server keeps 16 MiB.
    assert kcoral_main(["run", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "(default 256 MiB; a server keeps at most its limit, 16 MiB by default)" in help_text
    assert "(default 300; a server allows at most its limit, 900 s by default)" in help_text
