"""What a session's cells say in a real kernel (jupyter_client, interrupted as Jupyter's
Stop interrupts it) when a cell is interrupted, when a cell's program kills the session's
worker, and what ``%kcoral session status`` says before and after: each line true and said
once. A real CPU server with one session seat."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from jupyter_client.manager import KernelManager, start_new_kernel
from server_process import client_token_file

import kcoral

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


class RealKernel:
    """A real kernel, each cell's streams, display texts and traceback as one text."""

    def __init__(self, manager: KernelManager, client: Any) -> None:
        self.manager = manager
        self.client = client

    def cell(self, source: str) -> str:
        said: list[str] = []

        def keep(message: dict[str, Any]) -> None:
            content = message["content"]
            if message["msg_type"] == "stream":
                said.append(content["text"])
            elif message["msg_type"] in ("display_data", "execute_result"):
                said.append(content["data"].get("text/plain", "") + "\n")
            elif message["msg_type"] == "error":
                said.append("\n".join(content["traceback"]) + "\n")

        self.client.execute_interactive(source, output_hook=keep, timeout=120)
        return "".join(said)


@contextmanager
def real_kernel(
    url: str, monkeypatch: pytest.MonkeyPatch, token: str | None = None
) -> Iterator[RealKernel]:
    monkeypatch.setenv("KCORAL_URL", url)
    if token is None:
        monkeypatch.delenv("KCORAL_TOKEN", raising=False)
    else:
        monkeypatch.setenv("KCORAL_TOKEN", token)
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        yield RealKernel(manager, client)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)  # its exit hook ends the session


@contextmanager
def kernel_in_a_session(
    url: str, monkeypatch: pytest.MonkeyPatch, token: str | None = None
) -> Iterator[tuple[RealKernel, str]]:
    """A real kernel whose cells run in a new session on ``url``, and the session's id;
    its first cell sets ``x = 41`` there."""
    with real_kernel(url, monkeypatch, token) as kernel:
        said = kernel.cell("%load_ext kcoral\n%kcoral session start")
        match = re.search(r"kcoral: session id ([0-9a-f-]{36})", said)
        assert match, said
        kernel.cell("%%kcoral --quiet\nx = 41")
        yield kernel, match.group(1)


@pytest.fixture
def one_seat_server(server_factory) -> Any:
    return server_factory("--num-workers", "1", "--max-sessions", "1")


LOOPING = "%%kcoral\nimport time\nprint('looping', flush=True)\nwhile True:\n    time.sleep(0.1)\n"


def interrupt_once_looping(kernel: RealKernel, sent: str) -> None:
    """Interrupt the kernel (SIGINT, as Jupyter's Stop) once the cell ``sent`` (``LOOPING``)
    shows its program's line: the kernel then follows the program, which is in its loop. A
    second's sleep after the session read RUNNING stood in for that on a loaded machine."""
    while True:
        message = kernel.client.get_iopub_msg(timeout=120)
        if message["parent_header"].get("msg_id") != sent:
            continue
        if message["msg_type"] == "stream" and "looping" in message["content"]["text"]:
            break
        assert message["msg_type"] != "error", message["content"]["traceback"]
    kernel.manager.interrupt_kernel()


def test_an_interrupted_session_cell_says_its_program_stopped_and_the_state_is_kept(
    one_seat_server, monkeypatch
) -> None:
    # Before: "the session keeps its state if the program stopped within 5 s (else the next
    # cell says it ended)", after the cell's own line had said the program had stopped.
    server = one_seat_server
    with kernel_in_a_session(server.url, monkeypatch) as (kernel, session_id):
        sent = kernel.client.execute(LOOPING)
        interrupt_once_looping(kernel, sent)
        said = []
        while True:
            message = kernel.client.get_iopub_msg(timeout=120)
            if message["parent_header"].get("msg_id") != sent:
                continue
            if message["msg_type"] == "error":
                said = message["content"]["traceback"]
            if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
                break
        label = f"session {session_id[:8]}"
        assert said == [
            f"CellCancelledError: interrupted: KeyboardInterrupt raised in {label}'s program "
            f"on {server.url}",
            "its program stopped and the session keeps its state: run the next cell",
        ]
        assert kernel.cell("%%kcoral --quiet\nprint(x + 1)").strip() == "42"


def test_a_cell_that_ends_its_session_says_why_once_and_session_status_says_it_ended(
    one_seat_server, monkeypatch
) -> None:
    # Before, the cell's hint: "has ended with this cell (session ended: its worker exited
    # during job <the job the line above names> (exit code 3); its state is lost): its
    # variables are gone"; and the status: "ended: worker_exited: session ended: its worker
    # exited ...", then "idle timeout" and "when this kernel ends: ended" of a session that
    # had ended. A live session's status did not say how much memory its state holds.
    with kernel_in_a_session(one_seat_server.url, monkeypatch) as (kernel, session_id):
        kernel.cell("%%kcoral --quiet\nkept = bytearray(64 * 1024 * 1024)")
        live = kernel.cell("%kcoral session status")
        memory = re.search(
            r"^memory: ([0-9.]+) (MiB|GiB) \(its worker's resident memory\)$", live, re.M
        )
        assert memory, live
        assert memory.group(2) == "GiB" or float(memory.group(1)) >= 64, live
        failed = kernel.cell("%%kcoral --quiet\nimport os\nos._exit(3)")
        assert (
            f"hint: session {session_id[:8]} ended with this cell: its worker exited during "
            "the cell (exit code 3); its variables are gone, %kcoral session start begins a "
            "new session"
        ) in failed, failed
        ended = kernel.cell("%kcoral session status")
    lines = ended.splitlines()
    assert lines[1:2] == ["state: ENDED"], lines
    assert re.fullmatch(
        r"ended: its worker exited during job [0-9a-f-]{36} \(exit code 3\); its state is lost",
        lines[-1],
    ), lines
    assert not any(line.startswith(("idle", "when this kernel ends")) for line in lines), lines


def test_a_session_cell_after_its_server_restarted_says_the_restart_ended_the_session(
    one_seat_server, server_factory, monkeypatch
) -> None:
    # Before: "session X is unknown to URL (the server restarted, or dropped it after it
    # ended)", though the server's own start time said which.
    first = one_seat_server
    with kernel_in_a_session(first.url, monkeypatch) as (kernel, session_id):
        first.stop()
        again = server_factory(
            "--num-workers", "1", "--max-sessions", "1", "--port", str(first.port)
        )
        assert again.url == first.url
        with kcoral.Client(again.url) as client:
            started = client.health()["started_at"]
        restarted = re.escape(started[11:19]) + " UTC"  # HH:MM:SS of 2026-12-07T17:49:00.1Z
        label = f"session {session_id[:8]}"
        first_cell = kernel.cell("%%kcoral --quiet\nprint(x)").splitlines()
        later_cell = kernel.cell("%%kcoral --quiet\nprint(x)").splitlines()
    assert re.fullmatch(
        f"SessionNotFoundError: {label} ended when {re.escape(first.url)} restarted "
        rf"\(at {restarted}\): its variables are gone",
        first_cell[0],
    ), first_cell
    assert re.fullmatch(
        f"SessionEndedError: {label} on {re.escape(first.url)} has ended: its server "
        rf"restarted \(at {restarted}\); its state is lost",
        later_cell[0],
    ), later_cell


def test_a_restarted_kernels_session_is_listed_as_stopped(one_seat_server, monkeypatch) -> None:
    # Before: "<id>  ENDED (deleted)  1 program  CPU": the API's word, for a session that
    # the kernel's restart ended, where the JupyterLab panel says "stopped".
    with kernel_in_a_session(one_seat_server.url, monkeypatch) as (kernel, session_id):
        kernel.manager.restart_kernel(now=False)  # its exit hook ends the session
        kernel.client.wait_for_ready(timeout=60)
        listed = kernel.cell("%load_ext kcoral\n%kcoral session list").splitlines()
    assert listed == [f"{session_id}  ENDED (stopped)  1 program  CPU"], listed


def test_an_admin_cannot_attach_another_owners_session_for_its_cells(
    server_factory, tmp_path, monkeypatch
) -> None:
    # Before: "attached to session X ...; %%kcoral cells run in it", then each cell "HTTP
    # 403 forbidden: this session runs only its owner's programs (alice)" with "the server
    # refuses this origin or host; its message names the flag to set", and the way out,
    # %kcoral session stop, ended alice's session ("ended by admin root"). And the admin's
    # %kcoral session list showed alice's session with no owner, as its own.
    tokens = client_token_file(tmp_path, "alice alice-token-0123\nroot root-token-0123 admin\n")
    server = server_factory(
        "--num-workers", "1", "--max-sessions", "1", "--auth-token-file", str(tokens)
    )
    with kernel_in_a_session(server.url, monkeypatch, "alice-token-0123") as (alice, session_id):
        with real_kernel(server.url, monkeypatch, "root-token-0123") as root:
            listed = root.cell("%load_ext kcoral\n%kcoral session list")
            attached = root.cell(f"%kcoral session attach {session_id}")
            own_cell = root.cell("%%kcoral --quiet\nprint('runs without a session')")
        assert attached.splitlines() == [
            f"SessionOfAnotherOwnerError: session {session_id[:8]} on {server.url} is alice's: "
            "only alice's cells run in it (your admin token, root, may read, interrupt and "
            "end it)",
            "nothing was attached; the JupyterLab panel's Stop ends it",
        ]
        assert own_cell.strip() == "runs without a session"
        # alice's alone: before, with no owner, as if they were the admin's own
        assert listed.splitlines() == [f"{session_id}  IDLE  1 program  CPU  owner alice"]
        assert alice.cell("%%kcoral --quiet\nprint(x)").strip() == "41"
