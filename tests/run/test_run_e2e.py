"""`kcoral run` against a real CPU server (CLIENT_API §11)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from child_setup import with_default_hangup
from server_process import running_server, start_server

import kcoral
from kcoral import results as results_module
from kcoral.cli import main as kcoral_main


def run(url: str, tool: str, *argv: str) -> int:
    """`kcoral run TOOL --url URL ARGV...` in this process; returns the exit status."""
    return kcoral_main(["run", tool, "--url", url, *argv])


def test_python_c_prints_remote_output_locally(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code = "import sys; print('out'); print('err', file=sys.stderr)"
    assert run(server_url, "python", "--", "-c", code) == 0
    captured = capfd.readouterr()
    assert captured.out == "out\n"
    assert "err\n" in captured.err


def test_kcoral_url_selects_the_server(
    server_url: str,
    in_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KCORAL_URL", server_url)
    assert kcoral_main(["run", "python", "--", "-c", "print(6 * 7)"]) == 0
    assert capfd.readouterr().out == "42\n"


def test_host_and_port_select_the_server_and_warn_about_kcoral_url(
    server_url: str,
    in_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KCORAL_URL", "http://127.0.0.1:9")
    port = server_url.rsplit(":", 1)[1]
    argv = ["run", "python", "--host", "127.0.0.1", "--port", port, "--", "-c", "print(1)"]
    assert kcoral_main(argv) == 0
    captured = capfd.readouterr()
    assert captured.out == "1\n"
    assert f"using http://127.0.0.1:{port}" in captured.err


def test_a_sent_directory_runs_as_a_script_with_its_layout_and_arguments(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    project = in_tmp / "proj"
    (project / "lib").mkdir(parents=True)
    (project / "lib" / "helper.py").write_text("WORD = 'helped'\n")
    (project / "main.py").write_text(
        "import os, sys\nsys.path.insert(0, 'proj/lib')\nimport helper\n"
        "print(helper.WORD, sys.argv[1:], os.getcwd() == os.environ['KCORAL_DIR'])\n"
    )
    assert run(server_url, "python", "--send", "proj", "--", "proj/main.py", "a", "b") == 0
    assert capfd.readouterr().out == "helped ['a', 'b'] True\n"


def test_dash_m_runs_a_sent_package(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (in_tmp / "pkg").mkdir()
    (in_tmp / "pkg" / "__init__.py").write_text("")
    (in_tmp / "pkg" / "__main__.py").write_text("import sys; print('pkg main', sys.argv[1:])\n")
    assert run(server_url, "python", "--send", "pkg", "--", "-m", "pkg", "x") == 0
    assert capfd.readouterr().out == "pkg main ['x']\n"


def _script_in_tools(directory: Path, name: str, text: str, mode: int) -> Path:
    (directory / "tools").mkdir()
    script = directory / "tools" / name
    script.write_text(text)
    script.chmod(mode)
    return script


def test_shell_runs_a_sent_executable_by_relative_path_with_its_mode_kept(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    text = '#!/bin/sh\necho "hello $1 from $(basename "$PWD")"\n'
    _script_in_tools(in_tmp, "hello.sh", text, 0o755)
    assert run(server_url, "shell", "--send", "tools", "--", "tools/hello.sh", "you") == 0
    assert capfd.readouterr().out == "hello you from work\n"


def test_shell_refuses_a_sent_executable_without_its_executable_bit_before_running(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # run soak: it was uploaded and failed there with "./s.sh: Permission denied"
    script = _script_in_tools(in_tmp, "s.sh", "#!/bin/sh\necho ran\n", 0o644)
    assert run(server_url, "shell", "--send", "tools", "--", "./tools/s.sh") == 2
    assert capfd.readouterr() == (
        "",
        "kcoral run: shell: ./tools/s.sh cannot run: it is sent without its executable bit; "
        "chmod +x it here\n",
    )
    script.chmod(0o755)
    assert run(server_url, "shell", "--send", "tools", "--", "./tools/s.sh") == 0
    assert capfd.readouterr().out == "ran\n"


def test_a_selector_the_server_does_not_fit_says_so_and_that_nothing_ran(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # run soak: it read "server error: HTTP 503: this server does not fit ...", a server
    # failing, where the --select given was the cause
    assert run(server_url, "shell", "--select", "gpu=h100", "--", "true") == 1
    assert capfd.readouterr().err == (
        "kcoral run: this server does not fit the selector gpu=h100: it offers gpu=cpu, "
        "gpus=0; nothing was run\n"
    )


def test_a_sent_folder_with_no_file_is_said_and_the_tool_still_runs(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # run soak: empty folders are not sent, so `--send e` of one holding only empty folders
    # (or __pycache__) sent nothing without a word, and the tool found no e/
    (in_tmp / "e" / "__pycache__").mkdir(parents=True)
    (in_tmp / "e" / "__pycache__" / "m.pyc").write_bytes(b"x")
    (in_tmp / "e" / "empty").mkdir()
    code = "import os; print(os.listdir('.'))"
    assert run(server_url, "python", "--send", "e", "--", "-c", code) == 0
    assert capfd.readouterr() == (
        "[]\n",
        "kcoral run: warning: --send 'e' holds no file to send (empty folders are not sent): "
        "the tool finds no e/\n",
    )


def test_shell_finds_a_bare_name_on_the_worker_path(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert run(server_url, "shell", "--", "python", "-c", "print('via PATH')") == 0
    assert capfd.readouterr().out == "via PATH\n"


def test_fetch_and_out_bring_files_and_directories_back(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code = (
        "import os; os.makedirs('res/sub'); os.makedirs('res/empty');"
        "open('res/sub/a.txt', 'w').write('A'); open('b.bin', 'wb').write(bytes(range(256)))"
    )
    out = in_tmp / "nested" / "out"
    argv = ["--fetch", "res", "--fetch", "b.bin", "--out", str(out), "--", "-c", code]
    assert run(server_url, "python", *argv) == 0
    assert (out / "res" / "sub" / "a.txt").read_text() == "A"
    assert (out / "res" / "empty").is_dir()
    assert (out / "b.bin").read_bytes() == bytes(range(256))


def test_binary_inputs_make_the_round_trip_unchanged(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    payload = os.urandom(3 << 20)
    (in_tmp / "blob.bin").write_bytes(payload)
    code = "import shutil; shutil.copyfile('blob.bin', 'copy.bin')"
    argv = ["--send", "blob.bin", "--fetch", "copy.bin", "--out", "o", "--", "-c", code]
    assert run(server_url, "python", *argv) == 0
    assert (in_tmp / "o" / "copy.bin").read_bytes() == payload
    assert (in_tmp / "blob.bin").read_bytes() == payload


def _make_tree(top: Path, names: list[str], leaf: str, data: bytes) -> None:
    """``top/names[0]/names[1]/.../leaf`` made through directory descriptors: the path is
    longer than PATH_MAX once anything stands in front of it."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in names:
            os.mkdir(name, dir_fd=fd)
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        with os.fdopen(os.open(leaf, os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "wb") as out:
            out.write(data)
    finally:
        os.close(fd)


def test_a_sent_folder_whose_remote_paths_pass_path_max_unpacks_whole(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # 'deep/' + 16 names of 250 bytes + a 56-byte one + 'leaf.txt': 4086 bytes, within the
    # 4096 a path may have; '/workspace/work/' (or any workspace) in front passes PATH_MAX.
    # The worker wrote by absolute path: a remote 'OSError: File name too long' traceback.
    names = [f"{level:02d}" + "x" * 248 for level in range(16)] + ["y" * 55]
    _make_tree(in_tmp / "deep", names, "leaf.txt", b"bottom")
    (in_tmp / "deep" / "top.txt").write_bytes(b"top")
    code = (
        "import os, sys\n"
        "fd = os.open('deep', os.O_RDONLY)\n"
        "for name in sys.argv[1:]:\n"
        "    fd = os.open(name, os.O_RDONLY, dir_fd=fd)\n"
        "print(os.read(os.open('leaf.txt', os.O_RDONLY, dir_fd=fd), 100).decode(),"
        " open('deep/top.txt').read())\n"
    )
    assert run(server_url, "python", "--send", "deep", "--", "-c", code, *names) == 0
    assert capfd.readouterr().out == "bottom top\n"


def test_a_fetched_folder_whose_remote_paths_pass_path_max_comes_back_whole(
    server_url: str, in_tmp: Path
) -> None:
    # The worker copied work/PATH to outputs/PATH by absolute path: 'missing output deep:
    # File name too long' (exit 1) for a tree the tool made within the protocol's limits.
    names = [f"{level:02d}" + "x" * 248 for level in range(16)] + ["y" * 55]
    code = (
        "import os, sys\nos.mkdir('deep')\nfd = os.open('deep', os.O_RDONLY)\n"
        "for name in sys.argv[1:]:\n    os.mkdir(name, dir_fd=fd)\n"
        "    fd = os.open(name, os.O_RDONLY, dir_fd=fd)\n"
        "os.write(os.open('leaf.txt', os.O_WRONLY | os.O_CREAT, dir_fd=fd), b'bottom')\n"
    )
    argv = ["--fetch", "deep", "--out", "o", "--", "-c", code, *names]
    assert run(server_url, "python", *argv) == 0
    fd = os.open(in_tmp / "o" / "deep", os.O_RDONLY)
    for name in [*names, "leaf.txt"]:
        child = os.open(name, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    with os.fdopen(fd, "rb") as leaf:
        assert leaf.read() == b"bottom"


def test_outputs_come_back_even_when_the_tool_fails(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code = "open('log.txt', 'w').write('partial'); raise SystemExit(5)"
    argv = ["--fetch", "log.txt", "--out", "o", "--", "-c", code]
    assert run(server_url, "python", *argv) == 5
    assert (in_tmp / "o" / "log.txt").read_text() == "partial"


def test_an_existing_out_directory_is_refused_and_left_untouched(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (in_tmp / "o").mkdir()
    (in_tmp / "o" / "mine.txt").write_text("keep")
    code = "open('mine.txt', 'w').write('theirs')"
    assert run(server_url, "python", "--fetch", "mine.txt", "--out", "o", "--", "-c", code) == 2
    assert (in_tmp / "o" / "mine.txt").read_text() == "keep"


@pytest.mark.parametrize("out", ["results.txt/o", "results.txt/deeper/o"])
def test_an_out_below_a_file_is_refused_before_the_tool_runs(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str], out: str
) -> None:
    # It ran the tool, then failed to save with "[Errno 17] File exists": outputs lost.
    (in_tmp / "results.txt").write_text("mine")
    code = "open('x', 'w').write('x'); print('ran')"
    assert run(server_url, "python", "--fetch", "x", "--out", out, "--", "-c", code) == 2
    captured = capfd.readouterr()
    assert captured.out == ""
    file = os.path.realpath(in_tmp / "results.txt")
    assert f"--out '{out}': '{file}' is not a directory" in captured.err
    assert (in_tmp / "results.txt").read_text() == "mine"


def test_ctrl_c_while_the_outputs_are_saved_says_the_tool_had_ended_and_saves_nothing(
    server_url: str,
    in_tmp: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Ctrl-C after the remote tool had ended said "the remote tool was cancelled".
    write_all = results_module._write_all
    written: list[int] = []

    def interrupted_after_one_file(fd: int, data: bytes) -> None:
        if written:
            raise KeyboardInterrupt  # as Ctrl-C between two files of the save
        written.append(fd)
        write_all(fd, data)

    monkeypatch.setattr(results_module, "_write_all", interrupted_after_one_file)
    code = "import os; os.mkdir('r'); [open(f'r/{n}', 'w').write(n) for n in 'abc']; print('ran')"
    assert run(server_url, "python", "--fetch", "r", "--out", "o", "--", "-c", code) == 130
    captured = capfd.readouterr()
    assert captured.out == "ran\n" and written
    out = os.path.realpath(in_tmp / "o")
    assert captured.err == (
        f"kcoral run: interrupted; the remote tool had ended; its outputs were not saved to "
        f"{out!r}\n"
    )
    assert not (in_tmp / "o").exists()  # the save removes what it had made


def test_a_missing_requested_output_exits_1_and_makes_no_empty_out(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    argv = ["--fetch", "never.txt", "--out", "o", "--", "-c", "pass"]
    assert run(server_url, "python", *argv) == 1
    assert "missing output never.txt" in capfd.readouterr().err
    # nothing came back, so no --out was made: the run again, its --fetch corrected, is
    # not refused with "--out 'o' already exists"
    assert not (in_tmp / "o").exists()
    argv = ["--fetch", "never.txt", "--out", "o", "--", "-c", "open('never.txt', 'w')"]
    assert run(server_url, "python", *argv) == 0
    assert (in_tmp / "o" / "never.txt").read_bytes() == b""


def test_a_remote_nonzero_exit_is_the_local_exit_status(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert run(server_url, "python", "--", "-c", "raise SystemExit(7)") == 7


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV], ids=["SIGKILL", "SIGSEGV"])
def test_a_remote_signal_death_exits_128_plus_the_signal_and_says_which(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str], sig: signal.Signals
) -> None:
    # a local shell says "Segmentation fault" for such a death; kcoral run said nothing
    code = f"import os; os.kill(os.getpid(), {int(sig)})"
    assert run(server_url, "python", "--", "-c", code) == 128 + sig
    said = capfd.readouterr().err
    assert said == f"kcoral run: the tool was killed by {sig.name} (signal {int(sig)})\n"


POOL_SCRIPT = """\
import multiprocessing, sys

def square(x):
    return x * x

if __name__ == "__main__":
    with multiprocessing.get_context(sys.argv[1]).Pool(2) as pool:
        print(pool.map(square, range(4)))
"""


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_script_with_a_spawn_or_forkserver_pool_ends_with_its_own_status(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str], method: str
) -> None:
    # Such a pool starts a resource tracker that exits only when it reads the end of its
    # pipe, just after the script: the worker's leftover check caught it still exiting and
    # failed every such run ("program left background processes running", status 1).
    (in_tmp / "pool.py").write_text(POOL_SCRIPT)
    status = run(server_url, "python", "--send", "pool.py", "--", "pool.py", method)
    captured = capfd.readouterr()
    assert (status, captured.out) == (0, "[0, 1, 4, 9]\n"), captured.err


def test_a_background_process_the_tool_leaves_running_still_fails_the_run(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert run(server_url, "shell", "--", "sh", "-c", "sleep 60 & echo started") == 1
    captured = capfd.readouterr()
    assert captured.out == "started\n"
    # it read "remote program failed (runtime): program left background processes running;
    # they were terminated [request ...]", for a tool that had exited 0
    assert captured.err == (
        "kcoral run: the tool left processes running when it ended; they were killed, so the "
        "run failed (a tool must wait for the processes it starts)\n"
    )


def test_env_sets_and_copies_variables_and_the_last_assignment_wins(
    server_url: str,
    in_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KCORAL_RUN_TEST_LOCAL", "copied value")
    code = (
        "import os, sys; e = os.environ;"
        "print(e['A'], e['KCORAL_RUN_TEST_LOCAL'], e['PATH'].split(os.pathsep)[0] =="
        " os.path.dirname(sys.executable), e['PATH'].endswith('/custom/bin'))"
    )
    argv = [
        "-e", "A=first", "--env", "A=second", "-e", "KCORAL_RUN_TEST_LOCAL",
        "-e", "PATH=/custom/bin", "--", "-c", code,
    ]  # fmt: skip
    assert run(server_url, "python", *argv) == 0
    assert capfd.readouterr().out == "second copied value True True\n"


@pytest.mark.parametrize(
    ("tool", "argv"),
    [
        ("ncu", ["--out", "o", "--", "--", "python", "-c", "pass"]),
        ("compute-sanitizer", ["--", "python", "-c", "pass"]),
        ("run-iket", ["--out", "o", "--", "profile", "--", "python", "-c", "pass"]),
    ],
)
def test_gpu_tools_are_reported_as_not_installed_here(
    server_url: str,
    in_tmp: Path,
    capfd: pytest.CaptureFixture[str],
    tool: str,
    argv: list[str],
) -> None:
    assert run(server_url, tool, *argv) == 1
    err = capfd.readouterr().err
    assert f"{tool} is not installed in the remote server environment" in err
    assert not (in_tmp / "o").exists()


def test_an_unknown_shell_executable_is_reported_as_not_installed(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert run(server_url, "shell", "--", "no-such-program-kcoral") == 1
    assert (
        "no-such-program-kcoral is not installed in the remote server environment"
        in capfd.readouterr().err
    )


def test_truncated_output_is_reported(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code = "print('x' * 100)"
    assert run(server_url, "python", "--output-limit-bytes", "10", "--", "-c", code) == 0
    captured = capfd.readouterr()
    assert captured.out == "x" * 10
    assert "remote stdout was truncated" in captured.err


def test_an_unreachable_server_exits_1(in_tmp: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert run("http://127.0.0.1:9", "python", "--", "-c", "pass") == 1
    err = capfd.readouterr().err
    # One line: the address and the reason, not urllib3's chain of wrappers (issue 29.6).
    assert err == (
        "kcoral run: cannot reach http://127.0.0.1:9: connection refused "
        "(is a KCoral server running there?)\n"
    )


def _start_sleeping_tool(
    server_url: str, marker: Path, then: str = "time.sleep(20)"
) -> subprocess.Popen[bytes]:
    """`kcoral run` of a remote tool that writes its pid to `marker`, then runs `then`."""
    code = (
        "import os, time; open(os.environ['MARK'] + '.tmp', 'w').write(str(os.getpid()));"
        "os.rename(os.environ['MARK'] + '.tmp', os.environ['MARK']); " + then
    )
    command = [
        sys.executable, "-m", "kcoral", "run", "python", "--url", server_url,
        "-e", f"MARK={marker}", "--", "-c", code,
    ]  # fmt: skip
    client = subprocess.Popen(
        with_default_hangup(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while not marker.exists():
        if client.poll() is not None or time.monotonic() > deadline:
            client.kill()
            pytest.fail(f"the remote tool did not start: {client.communicate()}")
        time.sleep(0.05)
    return client


# If the server does not cancel, the sleeping tool holds the module's only worker until it
# is killed below.
@pytest.mark.slow
def test_ctrl_c_exits_130_and_cancels_the_remote_tool(server_url: str, in_tmp: Path) -> None:
    err = _signal_and_check_cancelled(server_url, in_tmp, signal.SIGINT, 130)
    assert b"interrupted" in err


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_cancel_the_remote_tool_as_ctrl_c_does(
    server_url: str, in_tmp: Path, sig: signal.Signals
) -> None:
    # A closed terminal (SIGHUP) or `timeout`/`kill` (SIGTERM) killed the client outright and
    # left the submitted job running on the server until its timeout.
    err = _signal_and_check_cancelled(server_url, in_tmp, sig, 128 + sig)
    assert err == f"kcoral run: terminated by {sig.name}; the remote tool was cancelled\n".encode()


def _signal_and_check_cancelled(
    server_url: str, in_tmp: Path, sig: signal.Signals, status: int
) -> bytes:
    """Send `sig` to a `kcoral run` whose remote tool runs; checks the exit status and that
    the remote tool is gone soon after; returns the client's stderr."""
    marker = in_tmp / "pid"
    client = _start_sleeping_tool(server_url, marker)
    remote_pid = int(marker.read_text())
    try:
        client.send_signal(sig)
        assert client.wait(timeout=30) == status
        err = client.communicate()[1]
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    _check_gone_soon(remote_pid)
    return err


def _check_gone_soon(remote_pid: int) -> None:
    deadline = time.monotonic() + 10
    while _alive(remote_pid):
        if time.monotonic() > deadline:
            os.kill(remote_pid, signal.SIGKILL)  # free the worker for the next test
            pytest.fail("the server did not cancel the remote tool")
        time.sleep(0.1)


@pytest.mark.slow
def test_a_reader_that_leaves_the_output_pipe_cancels_the_remote_tool_quietly(
    server_url: str, in_tmp: Path
) -> None:
    # `kcoral run ... | head -1` printed a BrokenPipeError traceback and left the job
    # running on the server.
    marker = in_tmp / "pid"
    printing = "[(print(i, flush=True), time.sleep(0.1)) for i in range(300)]"
    client = _start_sleeping_tool(server_url, marker, then=printing)
    remote_pid = int(marker.read_text())
    try:
        assert client.stdout is not None and client.stderr is not None
        assert client.stdout.readline() == b"0\n"
        client.stdout.close()  # as `head -1` does
        assert client.wait(timeout=30) == 128 + signal.SIGPIPE
        assert client.stderr.read() == b""
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    _check_gone_soon(remote_pid)


@pytest.mark.slow
def test_a_server_restarted_under_a_run_is_named_as_the_reason(
    in_tmp: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # The restarted server no longer knows the job; the user was told only
    # "server error: HTTP 404: job not found", about a job they never saw.
    directory = tmp_path_factory.mktemp("restarted-server")
    server = start_server(directory, ["--log-dir", ""])
    client = None
    try:
        client = _start_sleeping_tool(server.url, in_tmp / "pid")
        client.send_signal(signal.SIGSTOP)  # its event stream breaks while it is stopped
        server.stop(signal.SIGKILL)
        server = start_server(directory, ["--log-dir", "", "--port", str(server.port)])
        client.send_signal(signal.SIGCONT)
        assert client.wait(timeout=60) == 1
        assert client.communicate()[1] == (
            b"kcoral run: the server no longer has this run's job (was it restarted?); "
            b"the remote tool's result is lost\n"
        )
    finally:
        if client is not None and client.poll() is None:
            client.kill()
            client.wait()
        server.stop()
        with contextlib.suppress(OSError, ValueError):  # the killed server's tool
            os.kill(int((in_tmp / "pid").read_text()), signal.SIGKILL)


def test_a_result_the_server_dropped_before_it_was_fetched_is_named_as_such(
    in_tmp: Path, tmp_path_factory: pytest.TempPathFactory, capfd: pytest.CaptureFixture[str]
) -> None:
    # A job larger than --job-retention-bytes is dropped as it ends (404 job_expired);
    # 6339a91 had taken every 404 for a restart of the server.
    directory = tmp_path_factory.mktemp("tiny-retention")
    with running_server(directory, ["--log-dir", "", "--job-retention-bytes", "1"]) as server:
        assert run(server.url, "python", "--", "-c", "print('hello')") == 1
    # (its output may or may not have been streamed before the job went)
    assert capfd.readouterr().err == (
        "kcoral run: the server dropped this run's result before it was fetched (job "
        "expired: its result and output alone are larger than --job-retention-bytes)\n"
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie waiting for its (killed) parent counts as gone
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


RUN_IKET_STAND_IN = """#!{python}
import os, sys
args = sys.argv[1:]
directory = args[args.index("--output-dir") + 1]
if os.path.exists(directory):
    print(f"run-iket: {{directory}} already exists", file=sys.stderr)
    sys.exit(3)
os.mkdir(directory)
with open(os.path.join(directory, "trace.json"), "w") as trace:
    trace.write('{{"traceEvents": []}}')
print("profiled", args[args.index("--") + 1:])
"""


def test_run_iket_gets_an_output_directory_that_does_not_exist_yet_and_its_trace_comes_back(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    tools = in_tmp / "tools"
    tools.mkdir()
    stand_in = tools / "run-iket"
    stand_in.write_text(RUN_IKET_STAND_IN.format(python=sys.executable))
    stand_in.chmod(0o755)
    argv = ["--out", "o", "-e", f"PATH={tools}", "--", "profile", "--", "python", "-c", "pass"]
    assert run(server_url, "run-iket", *argv) == 0, capfd.readouterr().err
    assert (in_tmp / "o" / "trace.json").read_text() == '{"traceEvents": []}'
    assert "profiled ['python', '-c', 'pass']" in capfd.readouterr().out


def test_kcoral_url_as_host_and_port_selects_the_server_as_in_the_magics(
    server_url: str,
    in_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KCORAL_URL", server_url.removeprefix("http://"))
    assert kcoral_main(["run", "python", "--", "-c", "print(6 * 7)"]) == 0
    assert capfd.readouterr().out == "42\n"
    address = server_url.removeprefix("http://")
    assert run(address, "python", "--", "-c", "print(7)") == 0
    assert capfd.readouterr().out == "7\n"


def test_a_script_that_was_not_sent_is_named_as_the_user_typed_it(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert run(server_url, "python", "--", "missing.py") == 2
    err = capfd.readouterr().err
    assert "missing.py: no such file here, and no --send input provides it" in err
    assert "kcoral-program-" not in err and "/work/" not in err  # no remote workspace path
    (in_tmp / "here.py").write_text("print('here')\n")
    assert run(server_url, "python", "--", "here.py") == 2
    assert "here.py was not sent (the tool runs remotely): add --send here.py" in (
        capfd.readouterr().err
    )
    assert run(server_url, "python", "--send", "here.py", "--", "./here.py") == 0
    assert capfd.readouterr().out == "here\n"


BLOCKER = """
import os, time
def wait(go):
    while not os.path.exists(go):
        time.sleep(0.01)
"""


def test_a_run_queued_behind_others_says_so_once_and_then_runs(
    tmp_path: Path, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Team soak: queued behind other requests, `kcoral run` printed nothing and looked
    hung."""
    go = tmp_path / "go"
    program = kcoral.Program()
    module = program.upload(kind="module", source=BLOCKER)
    program.run(fn=program.get_function(module=module, name="wait"), args=[str(go)])
    with (
        running_server(tmp_path / "server", ["--num-workers", "1", "--log-dir", ""]) as server,
        kcoral.Client(server.url) as client,
    ):
        blockers = [client.submit(program), client.submit(program)]  # one runs, one waits

        def release_once_the_run_waits() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # the run's job, behind the waiting blocker
                if any(job["queue_position"] == 1 for job in client.jobs()):
                    break
                time.sleep(0.05)
            go.touch()

        releaser = threading.Thread(target=release_once_the_run_waits)
        releaser.start()
        assert run(server.url, "python", "--", "-c", "print('ran')") == 0
        releaser.join()
        for blocker in blockers:
            blocker.wait(60)
    captured = capfd.readouterr()
    assert captured.out == "ran\n"
    said = "kcoral run: queued behind 1 other request; the tool starts when a worker is free\n"
    assert captured.err.count(said) == 1, captured.err
