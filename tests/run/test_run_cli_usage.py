"""`kcoral run` command lines: help, usage errors (exit 2) and parsed options, no server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kcoral.cli import main as kcoral_main
from kcoral.run import command as run_cli
from kcoral.run.arguments import HELP_WIDTH, parse_command_line
from kcoral.run.tools import TOOLS, UsageError

URL = "http://127.0.0.1:9"


@pytest.fixture(autouse=True)
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to contact a server fails the test."""

    def refuse(*_args: object) -> None:
        raise AssertionError("a usage error must not contact a server")

    monkeypatch.setattr(run_cli, "execute", refuse)
    monkeypatch.delenv("KCORAL_URL", raising=False)


def parse(*argv: str, environ: dict[str, str] | None = None) -> run_cli.RunOptions:
    return parse_command_line(list(argv), {} if environ is None else environ)


def test_run_help_and_tool_help_print_without_a_server(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert kcoral_main(["run", "--help"]) == 0
    assert "usage: kcoral run TOOL" in capsys.readouterr().out
    assert kcoral_main(["run", "ncu", "--help"]) == 0
    out = capsys.readouterr().out
    assert "kcoral run ncu" in out and "--out" in out


@pytest.mark.parametrize("tool", [[], ["python"], ["ncu"], ["shell"]], ids=" ".join)
def test_run_help_says_where_the_token_comes_from_and_gives_sizes_in_units(
    capsys: pytest.CaptureFixture[str], tool: list[str]
) -> None:
    # Before, no help said how a server's token reaches `kcoral run` (only KCORAL_TOKEN
    # does), and the output limit's default read as the byte count 268435456.
    assert kcoral_main(["run", *tool, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "its token, if it needs one, comes from $KCORAL_TOKEN" in out
    assert "(default 256 MiB;" in out and "268435456" not in out


@pytest.mark.parametrize("tool", ["", *TOOLS], ids=lambda tool: tool or "run")
def test_every_help_line_but_the_usage_fits_the_helps_width(tool: str) -> None:
    # Each tool's description was one line of up to 178 characters, which an 80-column
    # terminal cut anywhere, and --fetch's and --select's lines ran past the rest.
    command = [sys.executable, "-m", "kcoral", "run", *([tool] if tool else []), "--help"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    usage, *lines = done.stdout.splitlines()
    assert usage.startswith("usage: kcoral run")
    assert [line for line in lines if len(line) > HELP_WIDTH] == []


@pytest.mark.parametrize("program", ["nsys", "torchrun", "python3.12"])
def test_an_unknown_tool_that_names_a_program_says_shell_runs_it(program: str) -> None:
    # `kcoral run nsys` listed the five tools alone, as if nsys could not be run at all
    command = [sys.executable, "-m", "kcoral", "run", program, "--", "profile", "./app"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.splitlines()[0] == (
        f"kcoral run: error: unknown tool {program!r} (choose from python, ncu, run-iket, "
        "compute-sanitizer, shell; any other program runs through shell: kcoral run shell "
        f"-- {program} ...)"
    )


def test_an_unknown_tool_that_names_no_program_lists_the_tools_alone() -> None:
    with pytest.raises(UsageError) as refused:
        parse("no such", "--", "x")
    assert str(refused.value) == (
        "unknown tool 'no such' (choose from python, ncu, run-iket, compute-sanitizer, shell)"
    )


@pytest.mark.parametrize(("size", "binary"), [("10MB", "10M (10 MiB)"), ("1gb", "1G (1 GiB)")])
def test_an_output_limit_in_decimal_units_says_why_it_is_refused_and_what_to_give(
    size: str, binary: str
) -> None:
    # "10MB" read "must be a size above 0, in bytes or with K, M, G or T (binary): 64K, 16M;
    # not '10MB'": a size everywhere else, refused without a reason the user could see
    command = [sys.executable, "-m", "kcoral", "run", "python", "--url", URL]
    command += ["--output-limit-bytes", size, "--", "-c", "print(1)"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.splitlines()[0] == (
        f"kcoral run: error: --output-limit-bytes {size!r} is ambiguous (decimal or binary?); "
        f"sizes here are binary: give {binary} or a number of bytes"
    )


def test_run_help_says_the_tools_status_stands_whatever_came_back_of_its_outputs() -> None:
    # It read "1 when the program failed, ... or a requested output is missing": a tool
    # that exited 3 with an output missing exits 3 (CLIENT_API §11), and "the program" was
    # the server's word for what kcoral run sends.
    command = [sys.executable, "-m", "kcoral", "run", "--help"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    said = " ".join(done.stdout.split())
    assert (
        "Exit status: the tool's own status (128 + N when killed by signal N), or 1 where it "
        "exited 0 but a requested output did not come back; 1 when the server could not be "
        "reached, a --send input could not be sent or the run failed before the tool's status "
        "came back; 130 after Ctrl-C; 2 for an invalid command line."
    ) in said


def test_run_help_names_an_unsendable_input_among_the_causes_of_exit_status_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # A --send input that cannot be read exits 1 (CLIENT_API §11), which the help's exit
    # statuses did not name: it read as an invalid command line, whose status is 2.
    assert kcoral_main(["run", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "1 when the server could not be reached, a --send input could not be sent " in out
    missing = str(tmp_path / "nothere")
    assert kcoral_main(["run", "shell", "--url", URL, "--send", missing, "--", "true"]) == 1
    assert (
        capsys.readouterr().err.strip()
        == f"kcoral run: --send {missing!r}: No such file or directory"
    )


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bash", "--url", URL, "--", "ls"],
        ["python", "--url", URL],
        ["python", "--url", URL, "x.py"],
        ["python", "--url", URL, "--"],
        ["python", "--url", URL, "--", "-i", "x.py"],
        ["python", "--url", URL, "--", "-"],
        ["python", "--url", URL, "--", "-u"],
        ["python", "--ur", URL, "--", "x.py"],
        ["python", "--bogus", "--", "x.py"],
        ["python", "--url", "--", "x.py"],
        ["python", "--url", URL, "--url", URL, "--", "x.py"],
        ["python", "--", "x.py"],
        ["python", "--url", "ftp://host", "--", "x.py"],
        ["python", "--url", "host", "--", "x.py"],  # host:port needs its port
        ["python", "--url", "::1:8000", "--", "x.py"],  # IPv6 only in brackets
        ["python", "--url", "http://", "--", "x.py"],
        ["python", "--url", "http://h:99999", "--", "x.py"],
        ["python", "--url", URL, "--port", "8000", "--", "x.py"],
        ["python", "--host", "http://h", "--", "x.py"],
        ["python", "--host", "h:80", "--", "x.py"],
        ["python", "--host", "h/p", "--", "x.py"],
        ["python", "--host", "a@b", "--", "x.py"],
        ["python", "--host", "a b", "--", "x.py"],
        ["python", "--host", "", "--", "x.py"],
        ["python", "--host", "[not-ipv6]", "--", "x.py"],
        ["python", "--port", "0", "--", "x.py"],
        ["python", "--port", "65536", "--", "x.py"],
        ["python", "--port", "http", "--", "x.py"],
        ["python", "--url", URL, "--timeout", "0", "--", "x.py"],
        ["python", "--url", URL, "--timeout", "1.5", "--", "x.py"],
        ["python", "--url", URL, "--timeout", "-3", "--", "x.py"],
        ["python", "--url", URL, "--output-limit-bytes", "0", "--", "x.py"],
        ["python", "--url", URL, "-e", "1BAD=x", "--", "x.py"],
        ["python", "--url", URL, "-e", "CUDA_VISIBLE_DEVICES=0", "--", "x.py"],
        ["python", "--url", URL, "--env", "KCORAL_DIR=/tmp", "--", "x.py"],
        ["python", "--url", URL, "-e", "KCORAL_TEST_SURELY_UNSET", "--", "x.py"],
        ["python", "--url", URL, "--fetch", "/abs", "--out", "o", "--", "x.py"],
        ["python", "--url", URL, "--fetch", "a/../b", "--out", "o", "--", "x.py"],
        ["python", "--url", URL, "--fetch", "a\\b", "--out", "o", "--", "x.py"],
        ["python", "--url", URL, "--fetch", "a", "--", "x.py"],
        ["python", "--url", URL, "--out", "o", "--", "x.py"],
        ["ncu", "--url", URL, "--", "--", "app"],
        ["ncu", "--url", URL, "--out", "o", "--", "app"],
        ["ncu", "--url", URL, "--out", "o", "--", "-o", "x", "--", "app"],
        ["ncu", "--url", URL, "--out", "o", "--fetch", "f", "--", "--", "app"],
        ["run-iket", "--url", URL, "--", "profile", "--", "app"],
        ["run-iket", "--url", URL, "--out", "o", "--", "--", "app"],
        ["shell", "--url", URL, "--", ""],
        ["python", "--url", URL, "--gpus", "0", "--", "x.py"],
        ["python", "--url", URL, "--gpus", "9", "--", "x.py"],
        ["python", "--url", URL, "--gpus", "two", "--", "x.py"],
    ],
)
def test_every_usage_error_exits_2_without_contacting_a_server(
    argv: list[str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert kcoral_main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kcoral run: error: ") and "usage: kcoral run" in err


def test_kcoral_without_a_sub_command_is_a_usage_error_and_help_is_not(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert kcoral_main([]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("kcoral: missing sub-command")
    assert "usage: kcoral" in captured.err
    assert kcoral_main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: kcoral {server,router,run}")


def test_an_existing_out_directory_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    existing = tmp_path / "out"
    existing.mkdir()
    argv = ["run", "python", "--url", URL, "--fetch", "a", "--out", str(existing), "--", "x.py"]
    assert kcoral_main(argv) == 2
    assert "already exists" in capsys.readouterr().err


def test_options_take_both_separate_and_attached_values() -> None:
    options = parse(
        "python",
        "--url=http://h:1/prefix/",
        "--timeout",
        "30",
        "--output-limit-bytes=5",
        "-eA=1",
        "--env",
        "B=2",
        "--env=A=3",
        "--send",
        "x",
        "--send=y",
        "--fetch",
        "./res//a",
        "--out",
        "o",
        "--",
        "-c",
        "pass",
    )
    assert options.url == "http://h:1/prefix"
    assert (options.timeout_seconds, options.output_limit_bytes) == (30, 5)
    assert options.env == {"B": "2", "A": "3"}
    assert options.send == ["x", "y"]
    assert options.fetch == ["res/a"]
    assert options.args == ["-c", "pass"]


def test_defaults_follow_the_spec() -> None:
    options = parse("python", "--", "x.py", environ={"KCORAL_URL": "https://k.example/"})
    assert options.url == "https://k.example"
    assert options.timeout_seconds == 300
    assert options.output_limit_bytes == 268435456
    assert options.gpu_count is None  # no gpu_count sent: the server's default
    assert options.warnings == []


def test_gpus_asks_for_a_set_of_that_many_gpus() -> None:
    assert parse("python", "--url", URL, "--gpus", "2", "--", "x.py").gpu_count == 2
    assert parse("python", "--url", URL, "--gpus=8", "--", "x.py").gpu_count == 8
    for refused in ("9", "0", "two", "-1"):  # 0 read "must be a positive integer"
        with pytest.raises(UsageError, match=f"^--gpus must be 1-8, not '{refused}'$"):
            parse("python", "--url", URL, "--gpus", refused, "--", "x.py")


def test_an_empty_kcoral_url_counts_as_unset() -> None:
    with pytest.raises(UsageError, match="no server"):
        parse("python", "--", "x.py", environ={"KCORAL_URL": ""})


def test_host_and_port_default_each_other_and_override_kcoral_url_with_a_warning() -> None:
    assert parse("python", "--port", "81", "--", "x.py").url == "http://127.0.0.1:81"
    assert parse("python", "--host", "gpu1", "--", "x.py").url == "http://gpu1:8000"
    options = parse(
        "python", "--host", "::1", "--", "x.py", environ={"KCORAL_URL": "http://other:1"}
    )
    assert options.url == "http://[::1]:8000"
    assert options.warnings and "http://[::1]:8000" in options.warnings[0]
    assert parse("python", "--host", "[fe80::1]", "--", "x.py").url == "http://[fe80::1]:8000"


def test_a_bare_env_name_copies_the_local_value() -> None:
    options = parse("python", "--url", URL, "-e", "HOME", "--", "x.py", environ={"HOME": "/h"})
    assert options.env == {"HOME": "/h"}


def test_everything_after_the_first_separator_belongs_to_the_tool() -> None:
    options = parse("shell", "--url", URL, "--", "tool", "--url", "--", "-h")
    assert options.args == ["tool", "--url", "--", "-h"]


@pytest.mark.parametrize("path", [".", "./", "a/.."])
def test_fetching_the_tools_directory_itself_says_to_name_what_is_in_it(path: str) -> None:
    # it read "path '.' is empty after normalization"
    with pytest.raises(UsageError) as refused:
        parse("python", "--url", URL, "--fetch", path, "--out", "o", "--", "x.py")
    assert str(refused.value) == (
        f"--fetch {path!r}: name a file or folder in the tool's directory, not the directory itself"
    )


def test_ncu_and_run_iket_need_out_and_do_not_need_fetch(tmp_path: Path) -> None:
    out = str(tmp_path / "o")
    assert parse("ncu", "--url", URL, "--out", out, "--", "--", "app").out == out
    assert parse("run-iket", "--url", URL, "--out", out, "--", "profile", "--", "a").out == out


def test_kcoral_run_loads_no_server_or_gpu_stack() -> None:
    import subprocess
    import sys

    code = (
        "import sys, kcoral.run.command, kcoral.client\n"
        "from kcoral.cli import main\n"
        "assert main(['run', '--help']) == 0\n"
        "heavy = {'tornado', 'torch', 'IPython', 'grpc', 'kcoral_server'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_an_option_before_the_tool_or_a_tool_option_before_the_dashes_says_where_it_goes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: "unknown tool '--url' (choose from ...)" and "unknown option -c", which said
    # neither that the tool comes first nor that the tool's own options follow '--'.
    assert kcoral_main(["run", "--url", URL, "python", "--", "x.py"]) == 2
    said = capsys.readouterr().err.splitlines()
    assert said[0] == (
        "kcoral run: error: option --url before the tool: the tool comes first, kcoral run "
        "TOOL --url ... -- ARGS (tools: python, ncu, run-iket, compute-sanitizer, shell)"
    ), said
    assert kcoral_main(["run", "python", "--url", URL, "-c", "print(1)"]) == 2
    said = capsys.readouterr().err.splitlines()
    assert said[0] == (
        "kcoral run: error: unknown option -c (the tool's own options go after '--')"
    ), said
