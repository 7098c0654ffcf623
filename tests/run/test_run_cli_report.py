"""How `kcoral run` turns a program result into output, files and an exit status (no server)."""

from __future__ import annotations

import ast
import http.server
import io
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from stand_in_http import serving

from kcoral.cli import main as kcoral_main
from kcoral.results import ProgramResult, ReturnedFile, ReturnedFolder
from kcoral.run import command as run_cli
from kcoral.run.arguments import parse_command_line
from kcoral.run.command import build_program
from kcoral.run.inputs import SMALL_INPUT_BYTES, LocalFileError, collect_inputs
from kcoral.run.outputs import report
from kcoral.run.progress import Progress, format_bytes
from kcoral.run.tools import UsageError


def options(tmp_path: Path, *extra: str, args: tuple[str, ...] = ("x.py",)):
    return parse_command_line(["python", "--url", "http://127.0.0.1:9", *extra, "--", *args], {})


def result(status: dict | None = None, *, outputs=None, failed=None, **fields) -> ProgramResult:
    results: dict = {}
    if status is not None:
        results["status"] = {
            "exit_code": 0,
            "signal": None,
            "error": None,
            "missing": [],
            "skipped": [],
            **status,
        }
    if outputs is not None:
        results["outputs"] = outputs
    values = {"stdout": "", "stderr": "", "stdout_truncated": False, "stderr_truncated": False}
    values.update(fields)
    return ProgramResult(
        "FAILED" if failed else "COMPLETED",
        "req-1",
        0.0,
        0.0,
        0.0,
        0.0,
        results,
        error=failed,
        **values,
    )


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"exit_code": 0}, 0),
        ({"exit_code": 3}, 3),
        ({"exit_code": None, "signal": signal.SIGKILL}, 128 + signal.SIGKILL),
        ({"exit_code": None, "error": "shell is not installed"}, 1),
    ],
)
def test_the_exit_status_is_the_tools_own(tmp_path: Path, status: dict, expected: int) -> None:
    assert report(options(tmp_path), result(status)) == expected


def test_captured_output_is_printed_and_truncation_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    res = result({}, stdout="out ✓\n", stderr="err\n", stderr_truncated=True)
    assert report(options(tmp_path), res) == 0
    captured = capsys.readouterr()
    assert captured.out == "out ✓\n"
    assert captured.err.startswith("err\n")
    assert "remote stderr was truncated" in captured.err


def test_a_failed_program_exits_1_with_a_diagnostic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    error = {"kind": "runtime", "message": "ValueError: boom", "traceback": "Traceback\n"}
    assert report(options(tmp_path), result(None, failed=error)) == 1
    assert "remote program failed (runtime): ValueError: boom" in capsys.readouterr().err


def test_a_missing_output_turns_success_into_1_and_keeps_a_failure_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = [{"path": "res.txt", "reason": "not found"}]
    folder = ReturnedFolder({})
    opts = options(tmp_path, "--fetch", "res.txt", "--out", str(tmp_path / "o1"))
    assert report(opts, result({"missing": missing}, outputs=folder)) == 1
    assert "missing output res.txt: not found" in capsys.readouterr().err
    opts = options(tmp_path, "--fetch", "res.txt", "--out", str(tmp_path / "o2"))
    assert report(opts, result({"exit_code": 4, "missing": missing}, outputs=folder)) == 4


def test_returned_files_are_saved_under_out_with_parents_created(tmp_path: Path) -> None:
    folder = ReturnedFolder({"res/a.txt": ReturnedFile(b"A")}, directories=["res", "res/empty"])
    out = tmp_path / "deep" / "er" / "out"
    opts = options(tmp_path, "--fetch", "res", "--out", str(out))
    assert report(opts, result({}, outputs=folder)) == 0
    assert (out / "res/a.txt").read_bytes() == b"A"
    assert (out / "res/empty").is_dir()


@pytest.mark.parametrize("shape", ["trailing slash", "dot-dot", "symlinked parent"])
def test_an_out_path_the_user_wrote_any_usual_way_is_where_the_outputs_land(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    """``prof/``, ``../prof`` and ``lnk/prof`` passed the command-line check and then, after
    the whole remote run, failed to save (outputs are saved without following links): the
    parent is now resolved before anything is sent."""
    work = tmp_path / "work"
    (tmp_path / "real").mkdir()
    work.mkdir()
    (work / "lnk").symlink_to(tmp_path / "real")
    monkeypatch.chdir(work)
    given, landed = {
        "trailing slash": ("prof/", work / "prof"),
        "dot-dot": ("../prof", tmp_path / "prof"),
        "symlinked parent": ("lnk/prof", tmp_path / "real" / "prof"),
    }[shape]
    opts = options(tmp_path, "--fetch", "res", "--out", given)
    assert opts.out == str(landed)
    folder = ReturnedFolder({"res/a.txt": ReturnedFile(b"A")}, directories=["res"])
    assert report(opts, result({}, outputs=folder)) == 0
    assert (landed / "res/a.txt").read_bytes() == b"A"


def test_undecodable_local_names_and_words_are_refused_before_anything_runs(
    tmp_path: Path,
) -> None:
    """A command line's or a directory's bytes that are not UTF-8 (arriving as lone
    surrogates) made a traceback while the request was encoded; now each is named."""
    bad = "caf\udce9"
    with pytest.raises(UsageError, match="not valid UTF-8"):
        options(tmp_path, args=("x.py", bad))
    with pytest.raises(UsageError, match="not valid UTF-8"):
        options(tmp_path, "-e", f"NAME={bad}")
    with pytest.raises(UsageError, match="not valid UTF-8"):
        options(tmp_path, "--fetch", "res", "--out", str(tmp_path / bad))
    project = tmp_path / "project"
    project.mkdir()
    (project / "ok.py").write_text("")
    (project / bad).write_text("")  # the file name's bytes: b"caf\xe9"
    with pytest.raises(LocalFileError, match="its name is not UTF-8"):
        collect_inputs([str(project)])


def test_an_out_directory_created_meanwhile_is_never_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    opts = options(tmp_path, "--fetch", "a", "--out", str(out))
    out.mkdir()
    (out / "keep").write_text("mine")
    folder = ReturnedFolder({"a": ReturnedFile(b"theirs")})
    assert report(opts, result({}, outputs=folder)) == 1
    assert (out / "keep").read_text() == "mine" and not (out / "a").exists()
    assert "cannot save the outputs" in capsys.readouterr().err


def test_inputs_keep_layout_and_executable_bit_and_skip_pycache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "proj"
    (project / "pkg" / "__pycache__").mkdir(parents=True)
    (project / "pkg" / "__pycache__" / "m.pyc").write_bytes(b"x")
    (project / "pkg" / "m.py").write_text("M")
    (project / ".hidden").write_text("H")
    (project / "empty").mkdir()
    (project / "run.sh").write_text("#!/bin/sh\n")
    (project / "run.sh").chmod(0o755)
    (tmp_path / "single.txt").write_text("S")
    monkeypatch.chdir(project)
    files = [
        (remote, blob.read(), x)
        for remote, blob, x in collect_inputs([".", str(tmp_path / "single.txt")])
    ]
    assert files == [
        ("proj/.hidden", b"H", False),
        ("proj/pkg/m.py", b"M", False),
        ("proj/run.sh", b"#!/bin/sh\n", True),
        ("single.txt", b"S", False),
    ]


@pytest.mark.parametrize("kind", ["symlink", "fifo", "top-symlink", "missing"])
def test_symlinks_special_files_and_missing_inputs_are_refused(tmp_path: Path, kind: str) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    target = project
    if kind == "symlink":
        (project / "link").symlink_to("/etc/passwd")
    elif kind == "fifo":
        import os

        os.mkfifo(project / "pipe")
    elif kind == "top-symlink":
        target = tmp_path / "alias"
        target.symlink_to(project)
    else:
        target = tmp_path / "nothing"
    with pytest.raises(LocalFileError):
        collect_inputs([str(target)])


SWAP_FOR_A_FIFO_AFTER_ITS_CHECK = """
import os, sys
from kcoral.cli import main

target, argv = sys.argv[1], sys.argv[2:]
swapped = []


def swapping(real):
    def checked(path, *args, **kwargs):
        info = real(path, *args, **kwargs)
        if isinstance(path, str) and os.path.basename(path) == "data.txt" and not swapped:
            swapped.append(True)  # the check saw a regular file; a FIFO is there now
            os.unlink(target)
            os.mkfifo(target)
        return info

    return checked


os.lstat, os.stat = swapping(os.lstat), swapping(os.stat)
sys.exit(main(argv))
"""


@pytest.mark.parametrize("sent", ["data.txt", "proj"])
def test_a_send_input_swapped_for_a_fifo_after_its_check_fails_instead_of_hanging(
    tmp_path: Path, sent: str
) -> None:
    # The file was opened without O_NONBLOCK: a FIFO with no writer blocked the client.
    (tmp_path / "proj").mkdir()
    target = tmp_path / ("data.txt" if sent == "data.txt" else "proj/data.txt")
    target.write_text("x")
    argv = ["run", "python", "--url", "http://127.0.0.1:9", "--send", sent, "--", "-c", ""]
    done = subprocess.run(
        [sys.executable, "-c", SWAP_FOR_A_FIFO_AFTER_ITS_CHECK, str(target), *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    shown = "data.txt" if sent == "data.txt" else "proj/data.txt"
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        f"kcoral run: --send: {shown!r} changed while it was read: it is now a FIFO\n"
    )


def test_two_inputs_with_the_same_remote_path_are_refused(tmp_path: Path) -> None:
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "x.py").write_text(sub)
    with pytest.raises(LocalFileError, match=r"x\.py"):
        collect_inputs([str(tmp_path / "a" / "x.py"), str(tmp_path / "b" / "x.py")])


def test_a_file_and_a_directory_of_one_remote_name_are_refused_with_a_name_between(
    tmp_path: Path,
) -> None:
    # 'a-b' sorts between 'a' and 'a/c': only neighbours were compared, and the worker
    # failed the program with a remote traceback ('inputs: path conflict at 'a/c'').
    for sub in ("x", "y/a", "z"):
        (tmp_path / sub).mkdir(parents=True)
    (tmp_path / "x" / "a").write_text("file")
    (tmp_path / "y" / "a" / "c").write_text("in a directory")
    (tmp_path / "z" / "a-b").write_text("between")
    inputs = [str(tmp_path / path) for path in ("x/a", "y/a", "z/a-b")]
    with pytest.raises(LocalFileError, match="'a' is both a file and a directory"):
        collect_inputs(inputs)


def test_a_local_file_error_exits_1_before_any_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(run_cli, "execute", lambda *_: pytest.fail("server contacted"))
    opts = options(tmp_path, "--send", str(tmp_path / "missing"))
    assert run_cli.run(opts) == 1
    assert "--send" in capsys.readouterr().err


def test_the_program_uploads_the_runner_inputs_and_returns_status_and_outputs(
    tmp_path: Path,
) -> None:
    opts = options(tmp_path, "--fetch", "r", "--out", str(tmp_path / "o"))
    (tmp_path / "tool.sh").write_bytes(b"#!/bin/sh\n")
    (tmp_path / "tool.sh").chmod(0o755)
    (tmp_path / "large.bin").write_bytes(bytes(SMALL_INPUT_BYTES))
    sent = collect_inputs([str(tmp_path / "tool.sh"), str(tmp_path / "large.bin")])
    program = build_program(opts, sent)
    ops = [(item["op"], item.get("kind"), item.get("path")) for item in program.instructions]
    assert ops == [
        ("upload", "module", None),
        ("get_function", None, None),
        ("upload", "bytes", None),
        ("upload", "file", "work/large.bin"),
        ("run", None, None),
        ("return", None, None),
        ("return", "folder", "outputs"),
    ]
    assert program.instructions[2]["id"] == "inputs"
    run = program.instructions[4]
    assert run["args"][0] == {"$ref": "inputs"}
    assert run["args"][1]["inputs"] == [["large.bin", False]]
    assert run["args"][1]["fetch"] == ["r"] and run["args"][1]["collect"] is True


def test_the_runner_source_is_the_runner_modules_in_one_that_imports_only_the_standard_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an uploaded module imports no other upload, and a server of PROTOCOL.md alone has no
    # kcoral: the three runner modules travel as one source that imports neither
    source = run_cli.runner_source()
    tree = ast.parse(source)
    imported = [
        alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names
    ]
    imported += [node.module or "" for node in tree.body if isinstance(node, ast.ImportFrom)]
    assert [name for name in imported if name.split(".")[0] not in sys.stdlib_module_names] == []
    defined = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
    defined += [
        target.id
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    ]
    assert sorted(name for name in set(defined) if defined.count(name) > 1) == []  # no clash
    namespace: dict = {}
    exec(compile(source, "<runner>", "exec"), namespace)
    monkeypatch.chdir(tmp_path)
    blob = namespace["pack_inputs"]([("make.sh", b"mkdir -p res; echo A > res/a.txt", True)])
    spec = {"tool": "shell", "args": ["sh", "make.sh"], "fetch": ["res"], "collect": True}
    status = namespace["run_tool"](blob, spec)
    assert (status["exit_code"], status["missing"]) == (0, [])
    assert (tmp_path / "outputs/res/a.txt").read_text() == "A\n"


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_silent_off_a_terminal_and_for_small_transfers() -> None:
    quiet = io.StringIO()
    with Progress("send", 1 << 30, quiet) as progress:
        progress.advance(1 << 30)
    small = FakeTerminal()
    with Progress("send", 10, small) as progress:
        progress.advance(10)
    assert quiet.getvalue() == "" and small.getvalue() == ""


def test_progress_shows_bytes_and_rate_on_a_terminal() -> None:
    now = [0.0]
    terminal = FakeTerminal()
    with Progress("send", 64 << 20, terminal, clock=lambda: now[0]) as progress:
        now[0] = 1.0
        progress.advance(32 << 20)
        now[0] = 2.0
        progress.advance(32 << 20)
    text = terminal.getvalue()
    assert "32.0 MiB of 64.0 MiB (32.0 MiB/s)" in text
    assert text.endswith("send: 64.0 MiB in 2.0 s (32.0 MiB/s)\n")
    assert format_bytes(1536) == "1.5 KiB" and format_bytes(3) == "3 B"


def test_a_url_where_no_kcoral_server_answers_is_said_to_be_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Another program on the port (here Python's http.server, which answers 501 to what
    # it does not know). Before: "server error: HTTP 501: HTTP 501".
    with serving(http.server.BaseHTTPRequestHandler) as url:
        assert kcoral_main(["run", "shell", "--url", url, "--", "true"]) == 1
    said = capsys.readouterr().err.strip().splitlines()
    assert said[-1] == (
        f"kcoral run: {url} answered HTTP 501 without a KCoral error: is it a KCoral server "
        "(or a proxy in front of one)?"
    ), said


def test_a_progress_started_while_another_draws_on_the_stream_stays_silent() -> None:
    # the client's upload line inside `kcoral run`'s own "sending inputs" line: two lines
    # redrawn in place on one terminal overwrote each other
    terminal = FakeTerminal()
    with Progress("outer", 64 << 20, terminal) as outer:
        with Progress("inner", 64 << 20, terminal) as inner:
            inner.advance(64 << 20)
        assert not inner.enabled and outer.enabled
        outer.advance(64 << 20)
    with Progress("after", 64 << 20, terminal) as after:  # the stream is free again
        after.advance(64 << 20)
    text = terminal.getvalue()
    assert "inner" not in text and "outer: 64.0 MiB in" in text and "after: 64.0 MiB" in text
