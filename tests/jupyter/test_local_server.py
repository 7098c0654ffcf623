"""The embedded local server: started on demand, advertised, stopped with the kernel; in a
real kernel, Jupyter's interrupt leaves it running and a shutdown leaves nothing behind."""

from __future__ import annotations

import contextlib
import queue
import re
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from IPython.utils.capture import capture_output
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager
from kcoral_jupyter.cell_errors import LocalServerGoneError
from kcoral_jupyter.extension import kernel_state_of
from kcoral_jupyter.local_server import LocalServer, advertised_servers
from kcoral_jupyter.runtime_records import kernel_connections

from kcoral import Client

pytestmark = pytest.mark.timeout(180)

#: ``KCoral.local_args`` of an embedded server that starts fast (conftest's ``FAST_LOCAL``).
FAST_LOCAL = ["--device", "cpu", "--sandbox", "none", "--log-dir", "", "--disk-cache-dir", ""]


def test_the_local_server_starts_advertises_itself_and_stops(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    server = LocalServer(
        ["--device", "cpu", "--sandbox", "none", "--log-dir", "", "--disk-cache-dir", ""]
    )
    try:
        url = server.start()
        assert server.start() == url  # idempotent
        assert Client(url).health()["status"] == "ok"
        assert [record["url"] for record in advertised_servers()] == [url]
    finally:
        assert server.stop()
    assert not server.running
    assert advertised_servers() == []
    assert not server.stop()


def test_a_stale_advertisement_is_ignored(tmp_path, monkeypatch) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    (runtime / "kcoral-local-1.json").write_text('{"url": "http://x", "pid": 999999999}')
    assert advertised_servers() == []
    assert not (runtime / "kcoral-local-1.json").exists()  # its kernel cannot remove it


def alive(pid: int) -> bool:
    """The process runs (a zombie, exited and not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def printed(kernel: BlockingKernelClient, source: str, on_text=None) -> str:
    """Run ``source`` in the kernel; its stream text (``on_text`` sees it as it comes)."""
    texts: list[str] = []

    def keep(message: dict) -> None:
        if message["msg_type"] == "stream":
            texts.append(message["content"]["text"])
            if on_text is not None:
                on_text("".join(texts))

    kernel.execute_interactive(source, output_hook=keep, timeout=120)
    return "".join(texts)


@pytest.fixture
def kernel_with_local_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[KernelManager, BlockingKernelClient, dict]]:
    """A real kernel, started as Jupyter starts it (its connection file
    ``kernel-<id>.json`` in the runtime directory, so it records its server there too),
    whose first magic started its embedded server; the server's advertisement (its ``pid``,
    ``url``) and its ``folder``."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    (tmp_path / "tmp").mkdir()
    # Its server's folder goes there: the one of a killed kernel stays behind.
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.delenv("KCORAL_URL", raising=False)
    monkeypatch.delenv("KCORAL_TOKEN", raising=False)
    manager = KernelManager(
        kernel_name="python3", connection_file=str(runtime / f"kernel-{uuid.uuid4()}.json")
    )
    manager.start_kernel()
    kernel = manager.blocking_client()
    kernel.start_channels()
    try:
        kernel.wait_for_ready(timeout=60)
        text = printed(
            kernel,
            f"%load_ext kcoral\n%config KCoral.local_args = {FAST_LOCAL!r}\n"
            "%kcoral local start\n%kcoral url\n%kcoral local log 1",
        )
        [record] = advertised_servers()
        assert [c["url"] for c in kernel_connections()] == [record["url"]]
        match = re.search(r"the last 1 line of (\S+)/server\.log", text)
        assert match, text
        yield manager, kernel, {**record, "folder": Path(match.group(1))}
    finally:
        kernel.stop_channels()
        manager.shutdown_kernel(now=True)


@pytest.mark.slow
def test_interrupting_a_cell_leaves_the_kernels_local_server_running(
    kernel_with_local_server,
) -> None:
    manager, kernel, server = kernel_with_local_server
    interrupted: list[bool] = []

    def interrupt_once_started(text: str) -> None:
        if "started" in text and not interrupted:
            interrupted.append(True)
            manager.interrupt_kernel()  # Jupyter's Stop button: SIGINT to the kernel's group

    cell = "%%kcoral\nimport time\nprint('started', flush=True)\ntime.sleep(60)\n"
    printed(kernel, cell, on_text=interrupt_once_started)
    assert interrupted
    deadline = time.monotonic() + 5  # the old code's server had shut down by then
    while time.monotonic() < deadline and alive(int(server["pid"])):
        time.sleep(0.1)
    assert alive(int(server["pid"]))
    # The next cell runs on the same server (not on a new one started behind the user's back).
    assert "next" in printed(kernel, "%%kcoral\nprint('next')\n")
    assert printed(kernel, "url = %kcoral url\nprint(url)").strip() == server["url"]


@pytest.mark.slow
def test_a_kernel_shutdown_stops_its_local_server_and_leaves_no_files(
    kernel_with_local_server, tmp_path: Path
) -> None:
    manager, _kernel, server = kernel_with_local_server
    assert server["folder"].is_dir()
    # Jupyter's shutdown: a request, then SIGTERM to a kernel still alive after half of
    # shutdown_wait_time (5 s by default; 10 s leaves a loaded machine room).
    manager.shutdown_wait_time = 10.0
    manager.shutdown_kernel()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and alive(int(server["pid"])):
        time.sleep(0.1)
    assert not alive(int(server["pid"]))
    # Its folder (log, ready file), its advertisement and the kernel's record of the server
    # it used are gone: nothing piles up in /tmp or in the runtime directory, kernel after
    # kernel.
    assert not server["folder"].exists()
    assert list((tmp_path / "runtime").glob("kcoral-*.json")) == []


@pytest.mark.slow
def test_a_kernel_killed_while_its_cell_runs_takes_its_local_server_with_it(
    kernel_with_local_server,
) -> None:
    manager, kernel, server = kernel_with_local_server
    kernel.execute("%%kcoral\nimport time\nprint('started', flush=True)\ntime.sleep(120)\n")
    text = ""
    deadline = time.monotonic() + 60
    while "started" not in text and time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            message = kernel.get_iopub_msg(timeout=1)
            if message["msg_type"] == "stream":
                text += message["content"]["text"]
    assert "started" in text
    # A kernel that dies without its exit hooks (killed, out of memory, a forced restart):
    # the old server got SIGTERM, which lets running programs finish (SERVER §12), and ran
    # this cell's two minutes on for nobody.
    manager.shutdown_kernel(now=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and alive(int(server["pid"])):
        time.sleep(0.1)
    assert not alive(int(server["pid"]))


@pytest.mark.slow
def test_what_a_kernel_killed_with_sigkill_left_goes_with_the_next_server_and_panel_poll(
    kernel_with_local_server, tmp_path: Path
) -> None:
    manager, kernel, server = kernel_with_local_server
    assert "ran" in printed(kernel, "%%kcoral\nprint('ran')\n")
    manager.shutdown_kernel(now=True)  # SIGKILL: no exit hook runs
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and alive(int(server["pid"])):
        time.sleep(0.1)
    temporary, runtime = tmp_path / "tmp", tmp_path / "runtime"
    left = sorted(p.name for p in temporary.iterdir())
    assert server["folder"].exists() and len(list(runtime.glob("kcoral-*.json"))) == 2, left
    # The next kernel's server (here a plain one, as `kcoral server` starts with the same
    # temporary directory) and the panel's next look at the runtime directory: before,
    # the folder with the server's log, the server's capture folder and the kernel's two
    # records (one with the server's token) stayed for good, kernel after kernel.
    next_server = LocalServer(FAST_LOCAL)
    try:
        next_server.start()
    finally:
        next_server.stop()
    assert sorted(p.name for p in temporary.iterdir()) == [], left
    assert advertised_servers() == [] and kernel_connections() == []
    assert list(runtime.glob("kcoral-*.json")) == []


# ------------------------------------------------------- in-process shells (Linux only)
# They start the embedded server, which needs Linux: not in test_magic_messages.py, whose
# tests also run disguised as macOS and Windows (tests/client/test_other_platforms.py).


def quietly(ip: Any, source: str) -> Any:
    """Run ``source`` as a cell of the in-process shell ``ip``, its output captured."""
    with capture_output():
        return ip.run_cell(source)


def test_a_job_of_a_stopped_local_server_is_said_to_have_ended_with_it(embedded_shell) -> None:
    quietly(embedded_shell, "%%kcoral --noblock -r job\nimport time\ntime.sleep(1)\n")
    job_id = embedded_shell.user_ns.pop("job").id
    url = embedded_shell.run_line_magic("kcoral", "url")
    with capture_output():
        embedded_shell.run_line_magic("kcoral", "local stop")
    result = quietly(embedded_shell, f"%kcoral attach {job_id}")
    error = result.error_in_exec
    # Before 491dfd0: "no answer from the server"; then "no answer from URL" with a hint to
    # start `kcoral server --port N` there, which would not have the job either.
    assert isinstance(error, LocalServerGoneError)
    lines = list(error._render_traceback_())
    assert lines[0] == (
        f"LocalServerGoneError: job {job_id} ran on this kernel's local server at {url}, "
        "which has stopped: its jobs ended with it"
    )
    assert "run its cell again" in lines[1], lines
    # Listing the jobs does not start a new server (which would say "no jobs" of its own).
    with capture_output() as listed:
        embedded_shell.run_line_magic("kcoral", "jobs")
    assert listed.stdout.strip() == (
        "kcoral: no jobs: this kernel's local server has stopped, and its jobs ended with it"
    )
    local = kernel_state_of(embedded_shell).local
    assert local is not None and not local.running


def test_a_job_of_a_local_server_that_exited_is_said_to_have_ended_with_it(
    embedded_shell,
) -> None:
    quietly(embedded_shell, "%%kcoral --noblock -r job\nimport time\ntime.sleep(30)\n")
    job_id = embedded_shell.user_ns.pop("job").id
    local = kernel_state_of(embedded_shell).local
    assert local is not None and local.process is not None
    local.process.kill()  # it died (out of memory, say): the kernel did not stop it
    local.process.wait(10)
    error = quietly(embedded_shell, f"%kcoral cancel {job_id}").error_in_exec
    assert isinstance(error, LocalServerGoneError), error
    assert "which has stopped: its jobs ended with it" in str(error)


def test_listing_jobs_before_the_first_cell_starts_no_local_server(embedded_shell) -> None:
    with capture_output() as listed:
        embedded_shell.run_line_magic("kcoral", "jobs")
    assert listed.stdout.strip() == (
        "kcoral: no jobs: no server configured, and this kernel's local server has not started yet"
    )
    assert kernel_state_of(embedded_shell).local is None


def test_stopping_the_local_server_says_it_waits_for_running_work_and_an_interrupt_ends_it(
    embedded_shell,
) -> None:
    # Before, it waited up to 30 s for the job in silence, and an interrupt left the
    # server running, no longer known to the kernel.
    quietly(embedded_shell, "%%kcoral --noblock -r job\nimport time\ntime.sleep(60)\n")
    job = embedded_shell.user_ns.pop("job")  # it outlives the stop's grace
    deadline = time.monotonic() + 60
    while job.status()["status"] != "RUNNING":
        assert time.monotonic() < deadline, job.status()
        time.sleep(0.05)
    local = kernel_state_of(embedded_shell).local
    assert local is not None and local.process is not None
    server = local.process
    main = threading.get_ident()
    timer = threading.Timer(1.0, signal.pthread_kill, (main, signal.SIGINT))
    timer.start()
    started = time.monotonic()
    with capture_output() as captured:
        embedded_shell.run_line_magic("kcoral", "local stop")
    timer.join()
    said = captured.stdout.splitlines()
    assert said[0].startswith("kcoral: stopping the local server at http://127.0.0.1:")
    assert said[0].endswith("gets up to 30 s to finish (interrupt to stop it now)")
    assert said[1:] == ["kcoral: local server stopped"]
    assert time.monotonic() - started < 20 and server.poll() is not None  # killed at once


@pytest.fixture
def busy_grpc() -> Iterator[None]:
    """gRPC in this process with a thread calling into it, as a notebook that uses a gRPC
    library has: its fork handlers then run in any child forked before ``exec``."""
    import grpc

    server = grpc.server(ThreadPoolExecutor(2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stop = threading.Event()

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    method = channel.unary_unary("/nothing/here")

    def call_in_a_loop() -> None:
        while not stop.is_set():
            with contextlib.suppress(grpc.RpcError):
                method(b"", timeout=0.01)

    def noticed(_state: grpc.ChannelConnectivity) -> None:
        pass

    # A connectivity subscription: Python gRPC's own polling thread calls into the core
    channel.subscribe(noticed, try_to_connect=True)
    caller = threading.Thread(target=call_in_a_loop, daemon=True)
    caller.start()
    try:
        yield
    finally:
        stop.set()
        caller.join(10)
        channel.unsubscribe(noticed)
        channel.close()
        server.stop(None)


def test_the_local_server_starts_every_time_in_a_kernel_whose_grpc_threads_are_busy(
    tmp_path, monkeypatch, busy_grpc
) -> None:
    # The server was started with a preexec_fn (its tie to the kernel), which runs Python
    # in the forked child before exec: there gRPC's fork handler left the child to die of
    # SIGSEGV about one start in four ('the local KCoral server exited').
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    for _ in range(8):
        server = LocalServer(FAST_LOCAL)
        try:
            assert Client(server.start()).health()["status"] == "ok"
        finally:
            server.stop()
