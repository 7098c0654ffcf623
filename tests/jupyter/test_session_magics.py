"""``%kcoral session`` (EXTENSIONS §11, issue 23.5) in an in-process IPython shell against a
real CPU server whose tokens name two identities, alice and bob: cells share state in a
session, ``-i``/``-o`` still move values, and every refusal is two lines that say why."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from jupyter_client.manager import start_new_kernel
from kcoral_jupyter.cell_errors import (
    SessionBusyError,
    SessionEndedError,
    SessionNotFoundError,
    SessionOptionsRefusedError,
    SessionSeatsFullError,
    SessionsUnavailableError,
)
from kcoral_jupyter.magics.sessions import programs_text
from kcoral_jupyter.runner import RemoteCellError
from kcoral_shell import kcoral_shell
from nbclient import NotebookClient
from notebook_cells import shown
from server_process import running_server

from kcoral import Client, KCoralError

pytestmark = pytest.mark.timeout(300)

ALICE = "token-alice-0123456789"
BOB = "token-bob-0123456789"
NAMES = ("x", "y", "n", "total", "_kcoral", "job")
EXIT_WAIT_SECONDS = 60.0


@pytest.fixture(scope="module")
def session_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One session seat, two identities."""
    directory = tmp_path_factory.mktemp("session-magics")
    tokens = directory / "tokens"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\n")
    tokens.chmod(0o600)
    args = ["--log-dir", "", "--num-workers", "1", "--max-sessions", "1"]
    with running_server(directory / "server", [*args, "--auth-token-file", str(tokens)]) as server:
        yield server.url


@pytest.fixture
def shell(session_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The extension loaded with alice's token; whatever session a test leaves is ended."""
    with kcoral_shell(session_server, monkeypatch, NAMES) as ip:
        ip.run_line_magic("config", f"KCoral.token = {ALICE!r}")
        try:
            yield ip
        finally:
            magics = ip.magics_manager.registry["KCoralMagics"]
            if magics.kernel.sessions.current is not None:
                magics.kernel.sessions.current.keep = False
                magics.kernel.sessions.end_at_exit()
                magics.kernel.sessions.current = None


def run(ip: Any, source: str) -> tuple[Any, Any]:
    with capture_output() as captured:
        result = ip.run_cell(source)
    return result, captured


def ok(ip: Any, source: str) -> tuple[Any, Any]:
    result, captured = run(ip, source)
    assert result.error_in_exec is None, (result.error_in_exec, captured.stdout)
    assert result.error_before_exec is None, result.error_before_exec
    return result, captured


def refusal_lines(result: Any, kind: type[Exception]) -> list[str]:
    """The lines a refused cell shows: it failed with ``kind``, told in two lines."""
    error = result.error_in_exec
    assert isinstance(error, kind), error
    lines = error._render_traceback_()
    assert len(lines) == 2, lines
    return lines


def texts(captured: Any) -> str:
    shown = [o.data.get("text/plain", "") for o in captured.outputs]
    return "\n".join([captured.stdout, captured.stderr, *shown])


def started_id(captured: Any) -> str:
    line = next(t for t in captured.stdout.splitlines() if t.startswith("kcoral: session id "))
    return line.removeprefix("kcoral: session id ").strip()


def record_of(url: str, session_id: str, token: str = ALICE) -> dict:
    with Client(url, token=token) as client:
        return client.attach_session(session_id).record


def test_names_a_session_cell_defines_are_there_in_the_next_cell(shell) -> None:
    _, started = ok(shell, "%kcoral session start")
    assert "%%kcoral cells run in it" in started.stdout
    ok(shell, "%%kcoral\ncount = 41\ndef bump():\n    return count + 1\n")
    result, captured = ok(shell, "%%kcoral\nbump()\n")
    assert result.result == 42
    summary = texts(captured)
    assert f"session {started_id(started)[:8]}" in summary and "COMPLETED" in summary


def test_in_and_out_values_still_move_between_kernel_and_session(shell) -> None:
    ok(shell, "%kcoral session start")
    shell.user_ns["n"] = 5
    ok(shell, "%%kcoral -i n\nbase = n * 10\n")
    shell.user_ns["n"] = 2
    result, _ = ok(shell, "%%kcoral -i n -o total\ntotal = base + n\ntotal\n")
    assert shell.user_ns["total"] == 52 and result.result == 52


def test_a_session_cell_sees_what_a_client_program_stored_in_kcoral_session_namespace(
    shell,
) -> None:
    ok(shell, "%kcoral session start")
    ok(shell, "%%kcoral\nimport kcoral.session\nkcoral.session.namespace['shared'] = 'yes'\n")
    result, _ = ok(shell, "%%kcoral\nshared\n")
    assert result.result == "yes"


def test_the_cells_provenance_carries_the_session_id(shell) -> None:
    _, started = ok(shell, "%kcoral session start")
    _, captured = ok(shell, "%%kcoral\n1\n")
    tagged = [o.metadata["kcoral"] for o in captured.outputs if (o.metadata or {}).get("kcoral")]
    assert tagged and tagged[-1]["session_id"] == started_id(started)


def test_session_status_shows_state_programs_idle_deadline_and_gpu(shell) -> None:
    _, started = ok(shell, "%kcoral session start --idle 300")
    ok(shell, "%%kcoral\nx = 1\n")
    _, captured = ok(shell, "%kcoral session status")
    shown = texts(captured)
    assert f"session: {started_id(started)}" in shown
    assert "state: IDLE" in shown and "programs: 1" in shown
    assert "idle deadline: in " in shown and "idle timeout: 300 s" in shown
    assert "GPU: none (CPU)" in shown and "when this kernel ends: ended" in shown


def test_stop_ends_the_session_and_a_following_cell_says_where_the_names_went(
    shell, session_server
) -> None:
    _, started = ok(shell, "%kcoral session start")
    ok(shell, "%%kcoral\nremembered = 1\n")
    _, stopped = ok(shell, "%kcoral session stop")
    assert "ended" in stopped.stdout and "without a session again" in stopped.stdout
    record = record_of(session_server, started_id(started))
    assert record["state"] == "ENDED" and record["end_reason"] == "deleted"
    result, _ = run(shell, "%%kcoral\nremembered\n")
    error = result.error_in_exec
    assert isinstance(error, RemoteCellError)
    rendered = "\n".join(error._render_traceback_())
    assert "NameError" in rendered
    assert f"since session {started_id(started)[:8]} was stopped" in rendered


def test_a_session_ended_on_the_server_refuses_the_next_cells_in_two_lines(
    shell, session_server
) -> None:
    _, started = ok(shell, "%kcoral session start")
    with Client(session_server, token=ALICE) as client:
        client.attach_session(started_id(started)).close()  # as another kernel's stop would
    for _ in range(2):  # the 410, then the same answer without asking the server
        result, _ = run(shell, "%%kcoral\n1\n")
        lines = refusal_lines(result, SessionEndedError)
        assert lines[0].endswith(" ended by its owner")  # not "has ended: session ended ..."
        assert "%kcoral session start" in lines[1]
    ok(shell, "%kcoral session stop")
    result, _ = ok(shell, "%%kcoral\n2\n")  # without a session again
    assert result.result == 2


def test_a_session_stopped_while_its_cell_runs_says_the_session_ended_not_run_it_again(
    shell, session_server
) -> None:
    # The panel's Stop (a DELETE) while the cell's program runs. Before, the cell said
    # "the job was cancelled ... run the cell again", and running it again said the
    # session had ended.
    _, started = ok(shell, "%kcoral session start")
    session_id = started_id(started)

    def stop_once_running() -> None:
        with Client(session_server, token=ALICE) as client:
            for _ in range(600):
                if client.attach_session(session_id).record.get("state") == "RUNNING":
                    client.attach_session(session_id).close()
                    return
                time.sleep(0.05)

    stopper = threading.Thread(target=stop_once_running)
    stopper.start()
    try:
        result, _ = run(shell, "%%kcoral\nimport time\ntime.sleep(60)\n")
    finally:
        stopper.join(60)
    lines = refusal_lines(result, SessionEndedError)
    assert lines[0].endswith(" ended by its owner"), lines  # not "has ended: session ended"
    assert "%kcoral session start" in lines[1]


def test_another_identity_cannot_attach_a_session_and_is_told_in_two_lines(
    shell, session_server
) -> None:
    _, started = ok(shell, "%kcoral session start --keep")
    session_id = started_id(started)
    ok(shell, "%%kcoral\nsecret = 'alice'\n")
    magics = shell.magics_manager.registry["KCoralMagics"]
    kept = magics.kernel.sessions.current
    magics.kernel.sessions.current = None  # as a new kernel: nothing attached
    try:
        shell.run_line_magic("config", f"KCoral.token = {BOB!r}")
        result, _ = run(shell, f"%kcoral session attach {session_id}")
        lines = refusal_lines(result, SessionNotFoundError)
        assert f"no session {session_id}" in lines[0]
        assert magics.kernel.sessions.current is None
        shell.run_line_magic("config", f"KCoral.token = {ALICE!r}")
        ok(shell, f"%kcoral session attach {session_id}")  # its owner may
        result, _ = ok(shell, "%%kcoral\nsecret\n")
        assert result.result == "alice"
    finally:
        magics.kernel.sessions.current = magics.kernel.sessions.current or kept


def test_an_attach_argument_that_is_not_a_session_id_is_refused_before_any_request(
    shell,
) -> None:
    for bad in ("../../v1/jobs", "not-an-id", "x" * 36):
        result, _ = run(shell, f"%kcoral session attach {bad}")
        assert isinstance(result.error_in_exec, UsageError), bad


def test_session_options_the_server_refuses_are_told_in_two_lines(shell) -> None:
    result, _ = run(shell, "%kcoral session start --idle 100000")
    lines = refusal_lines(result, SessionOptionsRefusedError)
    assert "--session-idle-seconds" in lines[0] and "--idle" in lines[1]
    for bad in ("--idle 0", "--gpus 0", "--idle soon", "--gpu 1"):
        result, _ = run(shell, f"%kcoral session start {bad}")
        assert isinstance(result.error_in_exec, UsageError), bad
        assert "%kcoral session start" in str(result.error_in_exec)


def test_a_second_start_while_a_session_is_active_is_refused(shell) -> None:
    ok(shell, "%kcoral session start")
    result, _ = run(shell, "%kcoral session start")
    assert isinstance(result.error_in_exec, UsageError)
    assert "session stop ends it first" in str(result.error_in_exec)


def test_a_full_set_of_session_seats_is_told_in_two_lines(shell, session_server) -> None:
    with Client(session_server, token=BOB) as client, client.session():
        result, _ = run(shell, "%kcoral session start")
    lines = refusal_lines(result, SessionSeatsFullError)
    assert "no session seat free" in lines[0]
    assert "--max-sessions" in lines[1]


def test_a_cell_sent_while_the_sessions_program_runs_is_told_the_session_is_busy(
    shell,
) -> None:
    ok(shell, "%kcoral session start")
    ok(shell, "%%kcoral --noblock -r job\nimport time\ntime.sleep(60)\n")
    result, _ = run(shell, "%%kcoral\n1\n")
    refusal_lines(result, SessionBusyError)
    ok(shell, "%kcoral session stop")  # kills the sleeping program with the session


def test_a_session_cell_may_not_name_another_server(shell) -> None:
    ok(shell, "%kcoral session start")
    result, _ = run(shell, "%%kcoral --url 127.0.0.1:9\n1\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert "session stop first" in str(result.error_in_exec)


def test_the_kernels_exit_ends_its_session_unless_it_was_kept(shell, session_server) -> None:
    magics = shell.magics_manager.registry["KCoralMagics"]
    _, started = ok(shell, "%kcoral session start --keep")
    magics.kernel.sessions.end_at_exit()
    assert record_of(session_server, started_id(started))["state"] == "IDLE"
    magics.kernel.sessions.current.keep = False
    magics.kernel.sessions.end_at_exit()
    assert record_of(session_server, started_id(started))["end_reason"] == "deleted"
    magics.kernel.sessions.current = None


def test_session_list_shows_the_callers_sessions(shell) -> None:
    _, started = ok(shell, "%kcoral session start")
    _, listed = ok(shell, "%kcoral session list")
    assert started_id(started) in listed.stdout and "IDLE" in listed.stdout


def test_session_help_and_usage_name_every_subcommand(shell) -> None:
    _, helped = ok(shell, "%kcoral --help")
    for text in ("session start", "session stop", "session status", "session attach", "--keep"):
        assert text in helped.stdout
    result, _ = run(shell, "%kcoral session restart")
    assert isinstance(result.error_in_exec, UsageError)
    assert "start" in str(result.error_in_exec) and "attach" in str(result.error_in_exec)


def test_a_server_without_sessions_is_told_in_two_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["--log-dir", "", "--num-workers", "1", "--max-sessions", "0"]
    with running_server(tmp_path / "server", args) as server:
        with kcoral_shell(server.url, monkeypatch, NAMES) as ip:
            result, _ = run(ip, "%kcoral session start")
        # A client that asks anyway: off, not full (before: 503 busy, retry in 1 s).
        with Client(server.url) as client, pytest.raises(KCoralError) as refused:
            client.session()
    assert (refused.value.status_code, refused.value.kind) == (404, "not_found")
    assert refused.value.message == "sessions are off on this server (--max-sessions 0)"
    lines = refusal_lines(result, SessionsUnavailableError)
    assert "does not offer sessions" in lines[0]
    assert "--max-sessions" in lines[1]


# ------------------------------------------------------------------ real kernels (nbclient)


def run_kernel(
    sources: list[str],
    url: str,
    token: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    interrupted: str | None = None,
) -> list[Any]:
    """Execute ``sources`` as a notebook in a fresh kernel (with ``KCORAL_URL`` and
    ``KCORAL_TOKEN``), which is shut down at the end; the executed code cells. The cell
    whose source is ``interrupted`` gets Jupyter's interrupt (SIGINT, a user's Stop button)
    after 30 s."""
    monkeypatch.setenv("KCORAL_URL", url)
    monkeypatch.setenv("KCORAL_TOKEN", token)
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    client = NotebookClient(
        notebook,
        timeout=120,
        timeout_func=lambda cell: 30 if cell.source == interrupted else 120,
        interrupt_on_timeout=True,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": tmp_path}},
    )
    client.km = client.create_kernel_manager()
    # A loaded machine may take longer than the 5 s Jupyter waits before it signals a kernel
    # that is still shutting down (its exit hooks, ours among them, would not run).
    client.km.shutdown_wait_time = EXIT_WAIT_SECONDS
    client.execute()
    return notebook.cells


def error_name(cell: Any) -> str | None:
    errors = [o for o in cell.outputs if o.output_type == "error"]
    return errors[0]["ename"] if errors else None


def session_id_in(cell: Any) -> str:
    match = re.search(r"kcoral: session id ([0-9a-f-]{36})", shown(cell))
    assert match, shown(cell)
    return match.group(1)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_kept_session_is_picked_up_by_its_owner_from_a_new_kernel_and_by_nobody_else(
    session_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = run_kernel(
        [
            "%load_ext kcoral",
            "%kcoral session start --keep",
            "%%kcoral\nweights = [1, 2, 3]\n",
            "scale = 10",
            "%%kcoral -i scale -o scaled\nscaled = [w * scale for w in weights]\n",
            "scaled",
            "%%kcoral\nlen(weights)\n",
        ],
        session_server,
        ALICE,
        tmp_path,
        monkeypatch,
    )
    assert [error_name(cell) for cell in first] == [None] * len(first), [shown(c) for c in first]
    session_id = session_id_in(first[1])
    assert "[10, 20, 30]" in shown(first[5])
    assert "3" in shown(first[6]) and f"session {session_id[:8]}" in shown(first[6])
    assert record_of(session_server, session_id)["state"] == "IDLE"  # kept after shutdown

    stranger = run_kernel(
        ["%load_ext kcoral", f"%kcoral session attach {session_id}", "%%kcoral\nweights\n"],
        session_server,
        BOB,
        tmp_path,
        monkeypatch,
    )
    assert error_name(stranger[1]) == "SessionNotFoundError"
    assert f"no session {session_id}" in shown(stranger[1])
    assert error_name(stranger[2]) == "RemoteCellError"  # ran stateless: no weights there

    owner = run_kernel(
        [
            "%load_ext kcoral",
            f"%kcoral session attach {session_id}",
            "%%kcoral\nsum(weights)\n",
            "%kcoral session stop",
            "%%kcoral\nweights\n",
        ],
        session_server,
        ALICE,
        tmp_path,
        monkeypatch,
    )
    assert error_name(owner[1]) is None and "attached to session" in shown(owner[1])
    assert "6" in shown(owner[2])
    assert "ended" in shown(owner[3])
    assert error_name(owner[4]) == "RemoteCellError"
    assert f"session {session_id[:8]} was stopped" in shown(owner[4])
    assert record_of(session_server, session_id)["end_reason"] == "deleted"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_kernel_shutdown_ends_a_session_that_was_not_kept(
    session_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cells = run_kernel(
        ["%load_ext kcoral", "%kcoral session start", "%%kcoral\nx = 1\n"],
        session_server,
        ALICE,
        tmp_path,
        monkeypatch,
    )
    assert [error_name(cell) for cell in cells] == [None] * 3, [shown(c) for c in cells]
    record = record_of(session_server, session_id_in(cells[1]))
    assert record["state"] == "ENDED" and record["end_reason"] == "deleted"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_kernel_restart_ends_a_session_that_was_not_kept(
    session_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KCORAL_URL", session_server)
    monkeypatch.setenv("KCORAL_TOKEN", ALICE)
    manager, kernel = start_new_kernel(kernel_name="python3")
    manager.shutdown_wait_time = EXIT_WAIT_SECONDS
    try:
        printed: list[str] = []

        def keep_text(message: dict) -> None:
            if message["msg_type"] == "stream":
                printed.append(message["content"]["text"])

        kernel.execute_interactive(
            "%load_ext kcoral\n%kcoral session start", output_hook=keep_text, timeout=120
        )
        match = re.search(r"kcoral: session id ([0-9a-f-]{36})", "".join(printed))
        assert match, printed
        manager.restart_kernel(now=False)  # as Jupyter's Restart: a shutdown request first
        record = record_of(session_server, match.group(1))
        assert record["state"] == "ENDED" and record["end_reason"] == "deleted"
    finally:
        kernel.stop_channels()
        manager.shutdown_kernel(now=True)


SLEEPING_CELL = "%%kcoral\nimport time\nprint('started', flush=True)\ntime.sleep(600)\n"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_interrupting_a_session_cell_stops_its_program_and_keeps_the_session(
    session_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cells = run_kernel(
        [
            "%load_ext kcoral",
            "%kcoral session start",
            "%%kcoral\nkept = 'still here'\n",
            SLEEPING_CELL,
            "%%kcoral\nkept\n",
            "%kcoral session status",
        ],
        session_server,
        ALICE,
        tmp_path,
        monkeypatch,
        interrupted=SLEEPING_CELL,
    )
    assert error_name(cells[3]) == "CellCancelledError"
    assert "KeyboardInterrupt raised in session" in shown(cells[3])
    assert error_name(cells[4]) is None and "still here" in shown(cells[4])
    assert "state: IDLE" in shown(cells[5])


def test_a_session_that_ran_one_program_says_one_program() -> None:
    # Before: "1 programs" in %kcoral session list and attach (docs soak, helper).
    assert programs_text({"programs": 1}) == "1 program"
    assert programs_text({"programs": 0}) == "0 programs"
    assert programs_text({"programs": 3}) == "3 programs"
