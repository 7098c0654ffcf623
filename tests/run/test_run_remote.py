"""The worker-side runner, called in-process in a temporary "workspace" (no server)."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kcoral.run import worker_side as run_remote
from kcoral.run.worker_outputs import outermost_paths
from kcoral.run.worker_side import pack_inputs, run_tool, unpack_inputs
from kcoral.run.worker_tree import enter_from


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def spec(tool: str, *args: str, **extra: object) -> dict:
    return {"tool": tool, "args": list(args), "env": {}, "fetch": [], "collect": False, **extra}


def test_inputs_round_trip_with_only_the_executable_bit(tmp_path: Path) -> None:
    blob = pack_inputs([("a/run.sh", b"#!/bin/sh\n", True), ("a/b/data.txt", b"x" * 3, False)])
    unpack_inputs(blob, str(tmp_path))
    assert (tmp_path / "a/run.sh").read_bytes() == b"#!/bin/sh\n"
    assert stat.S_IMODE((tmp_path / "a/run.sh").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a/b/data.txt").stat().st_mode) == 0o600


_opened: list[object] = []


def _record_opens(event: str, args: tuple) -> None:
    if event == "open" and _opened and _opened[0] == "counting":
        _opened.append(args[0])


@contextlib.contextmanager
def _counting_opens() -> Iterator[list[object]]:
    """What is opened inside the block; a hook stays for the session, so one is added."""
    if not _opened:
        sys.addaudithook(_record_opens)
        _opened.append("added")
    _opened[:] = ["counting"]
    opened: list[object] = []
    try:
        yield opened
    finally:
        opened.extend(_opened[1:])
        _opened[:] = ["added"]


def test_unpacking_opens_each_input_once_and_sets_exact_modes_whatever_the_umask(
    tmp_path: Path,
) -> None:
    # os.fdopen made each input file a file object too: an fstat, an ioctl and two lseeks
    # more per file, a third of the calls of a --send of many small files
    big = os.urandom(3 << 20)
    files = [(f"d/f{index}", b"%d" % index, index % 2 == 0) for index in range(50)]
    files += [("empty", b"", False), ("big", big, True)]
    blob = pack_inputs(sorted(files))
    old_umask = os.umask(0o277)  # strips the owner's write and execute bits at creation
    try:
        with _counting_opens() as opened:
            unpack_inputs(blob, str(tmp_path))
    finally:
        os.umask(old_umask)
    assert not [what for what in opened if isinstance(what, int)]  # no file object on an fd
    directories = {str(tmp_path), "d", ".."}
    file_opens = sorted(what for what in opened if what not in directories)
    assert file_opens == sorted(path.rsplit("/", 1)[-1] for path, _, _ in files)  # once each
    for path, data, executable in files:
        assert (tmp_path / path).read_bytes() == data
        mode = stat.S_IMODE((tmp_path / path).stat().st_mode)
        assert mode == (0o700 if executable else 0o600), path


def _mode_below(top: Path, path: str) -> int:
    """The mode of ``path`` below ``top``, reached a directory at a time (past PATH_MAX)."""
    parts = path.split("/")
    directory = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for part in parts[:-1]:
        directory = enter_from(
            directory, os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=directory)
        )
    try:
        return stat.S_IMODE(os.stat(parts[-1], dir_fd=directory).st_mode)
    finally:
        os.close(directory)


def test_uploaded_inputs_of_a_nested_tree_get_their_modes_entering_each_directory_once(
    tmp_path: Path,
) -> None:
    # a file upload has the server's mode: here each file starts with the other one
    deep = "/".join(["d" * 200] * 25)  # 5 KiB below tmp_path: past PATH_MAX from '/'
    inputs = [("a/b/run.sh", True), ("top", False), ("a/c/data", False), ("a/b/x", False)]
    inputs += [(f"{deep}/tool", True), ("a/b/c/y", True)]
    unpack_inputs(pack_inputs(sorted((p, b"", not x) for p, x in inputs)), str(tmp_path))
    with _counting_opens() as opened:
        run_remote.set_input_modes(str(tmp_path), inputs)  # listed in no particular order
    for path, executable in inputs:
        assert _mode_below(tmp_path, path) == (0o700 if executable else 0o600), path
    directories = [str(tmp_path), "a", "b", "c", "c", *deep.split("/")]
    files = [path.rsplit("/", 1)[-1] for path, _ in inputs]
    assert sorted(what for what in opened if what != "..") == sorted(directories + files)


@pytest.mark.parametrize("path", ["../x", "/etc/x", "a//b", "a/./b", "", "a/"])
def test_an_inputs_blob_with_an_unsafe_path_is_refused(tmp_path: Path, path: str) -> None:
    with pytest.raises(ValueError, match="unsafe path"):
        unpack_inputs(pack_inputs([(path, b"", False)]), str(tmp_path))


def test_an_inputs_blob_with_conflicting_paths_is_refused(tmp_path: Path) -> None:
    blob = pack_inputs([("a", b"", False), ("a/b", b"", False)])
    with pytest.raises(ValueError, match="conflict"):
        unpack_inputs(blob, str(tmp_path))


def test_a_truncated_inputs_blob_is_refused(tmp_path: Path) -> None:
    blob = pack_inputs([("a", b"hello", False)])
    with pytest.raises(ValueError, match="truncated"):
        unpack_inputs(blob[:-1], str(tmp_path))
    with pytest.raises(ValueError, match="not a kcoral"):
        unpack_inputs(b"garbage", str(tmp_path))


def test_python_runs_in_the_inputs_directory_with_kcoral_dir_and_env(
    workspace: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code = "import os, sys; print(os.getcwd(), os.environ['KCORAL_DIR'], os.environ['GREETING'])"
    report = run_tool(None, spec("python", "-c", code, env={"GREETING": "hi"}))
    assert report["exit_code"] == 0 and report["signal"] is None and report["error"] is None
    work = str(workspace / run_remote.WORK_DIR)
    assert capfd.readouterr().out.split() == [work, work, "hi"]


def test_the_interpreter_directory_comes_first_on_path_even_with_env_path(
    workspace: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code = "import os; print(os.environ['PATH'])"
    run_tool(None, spec("python", "-c", code, env={"PATH": "/nowhere"}))
    assert capfd.readouterr().out.strip() == f"{os.path.dirname(sys.executable)}:/nowhere"


def test_stdin_is_closed_for_the_tool(workspace: Path, capfd: pytest.CaptureFixture[str]) -> None:
    run_tool(None, spec("python", "-c", "import sys; print(repr(sys.stdin.read()))"))
    assert capfd.readouterr().out.strip() == "''"


def test_exit_codes_and_signals_are_reported(workspace: Path) -> None:
    report = run_tool(None, spec("python", "-c", "raise SystemExit(7)"))
    assert (report["exit_code"], report["signal"]) == (7, None)


def test_a_signal_death_is_reported_as_the_signal(workspace: Path) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    report = run_tool(None, spec("python", "-c", code))
    assert (report["exit_code"], report["signal"]) == (None, signal.SIGTERM)


def test_shell_runs_an_executable_relative_to_the_inputs(
    workspace: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    inputs = pack_inputs([("tools/hello.sh", b'#!/bin/sh\necho hello "$1"\n', True)])
    report = run_tool(inputs, spec("shell", "tools/hello.sh", "world"))
    assert report["exit_code"] == 0
    assert capfd.readouterr().out == "hello world\n"


@pytest.mark.parametrize(
    ("tool", "args", "name"),
    [
        ("shell", ["no-such-tool-xyz"], "no-such-tool-xyz"),
        ("ncu", ["--", "app"], "ncu"),
        ("compute-sanitizer", ["app"], "compute-sanitizer"),
        ("run-iket", ["profile", "--", "app"], "run-iket"),
    ],
)
def test_a_missing_executable_is_reported_as_not_installed(
    workspace: Path, tool: str, args: list[str], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    report = run_tool(None, spec(tool, *args))
    assert report["error"] == f"{name} is not installed in the remote server environment"
    assert report["exit_code"] is None and report["signal"] is None


@pytest.mark.parametrize(
    ("argv", "env", "error"),
    [
        # each read "... is not installed in the remote server environment"
        (["./bench"], {}, "./bench: no such file among the --send inputs (the tool's "
         "directory holds only them)"),
        (["/no/such/bench"], {}, "/no/such/bench: no such file on the server"),
        (["sh", "-c", "true"], {"PATH": "/nonexistent"},
         "sh is not on the remote PATH that --env PATH set"),
    ],
)  # fmt: skip
def test_a_tool_not_found_says_where_it_was_looked_for(
    workspace: Path, argv: list[str], env: dict[str, str], error: str
) -> None:
    report = run_tool(None, spec("shell", *argv, env=env))
    assert report["error"] == error


def test_a_sent_executable_named_bare_is_not_found_with_the_path_that_runs_it(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # run soak: `--send s.sh -- s.sh` said "s.sh is not installed in the remote server
    # environment" alone, of a file that was right there
    monkeypatch.setenv("PATH", "/nonexistent")
    inputs = pack_inputs([("s.sh", b"#!/bin/sh\necho ran\n", True)])
    report = run_tool(inputs, spec("shell", "s.sh"))
    assert report["error"] == (
        "s.sh is not installed in the remote server environment; the sent s.sh runs as ./s.sh"
    )


def test_fetched_files_and_directories_are_collected_even_after_a_failure(
    workspace: Path,
) -> None:
    code = (
        "import os; os.makedirs('res/empty'); open('res/a.txt','w').write('A');"
        "os.symlink('a.txt', 'res/link'); open('top.txt','w').write('T'); raise SystemExit(3)"
    )
    fetch = ["res", "res/a.txt", "top.txt", "absent.txt"]
    report = run_tool(None, spec("python", "-c", code, fetch=fetch, collect=True))
    outputs = workspace / run_remote.OUTPUTS_DIR
    assert report["exit_code"] == 3
    assert (outputs / "res/a.txt").read_text() == "A"
    assert (outputs / "res/empty").is_dir()
    assert (outputs / "top.txt").read_text() == "T"
    assert not (outputs / "res/link").exists()
    assert (report["skipped"], report["links"]) == ([], ["res/link"])
    reason = "not found; the tool's directory holds res/, top.txt"
    assert report["missing"] == [{"path": "absent.txt", "reason": reason}]


def test_a_fetched_symlink_is_a_missing_output(workspace: Path) -> None:
    code = "import os; os.symlink('/etc/passwd', 'p')"
    report = run_tool(None, spec("python", "-c", code, fetch=["p"], collect=True))
    assert report["missing"] == [
        {"path": "p", "reason": "is a symbolic link (links are not fetched)"}
    ]


def test_outermost_paths_drop_duplicates_and_nested_paths() -> None:
    assert outermost_paths(["a/b", "a", "a-b", "a", "c/d"]) == ["a", "a-b", "c/d"]
