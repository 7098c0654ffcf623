"""The fleet in a notebook (issue 33 point 3): ``%kcoral status`` through a router shows its
kinds and labels with nodes, free seats, queue and estimated wait (a real kernel, nbclient);
a cell queued at the router says what it waits for; ``--select`` is checked before anything
is sent. A real router with two real CPU nodes, one reporting another kind."""

from __future__ import annotations

import _thread
import contextlib
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from kcoral_shell import kcoral_shell
from nbclient import NotebookClient
from notebook_cells import shown
from waiting import wait_for

from kcoral import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from kcoral_server.node import supervisor as supervisor_module
from raw_http import call_program, post_execute, request
from router_helpers import Node, RouterProcess, start_router

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

OTHER_KIND = {"gpu": "h100", "arch": "sm_90a", "memory_bytes": 80 << 30, "gpus": 1}
# A probe past the default 1 s (a node's server starved of CPU under load) sends failing
# statuses every 0.3 s, and the router reads the node unhealthy for a second: a cell then got
# 503 "no ready node". 4 s stays under the router's 5 s status age (test_router_selectors).
PATIENT_PROBES = ("--health-timeout-seconds", "4")
HOLD = (
    "import os, time\n\n"
    "def main(path):\n"
    "    while not os.path.exists(path):\n"
    "        time.sleep(0.02)\n"
    "    return 1\n"
)


def fleet_status(router: RouterProcess) -> dict[str, Any]:
    info = request(router.url, "GET", "/v1/info")
    return info.body.get("fleet_status") or {} if info.status == 200 else {}


def default_row(router: RouterProcess) -> dict[str, Any]:
    kinds = fleet_status(router).get("kinds") or [{}]
    return kinds[0]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    tmp = tmp_path_factory.mktemp("fleet")
    router = start_router(tmp, "--status-check-interval-seconds", "0.3")
    other = {supervisor_module.NODE_KIND_OVERRIDE_ENV: json.dumps(OTHER_KIND)}
    # cpu-a first: its kind is the default (the first kind with a healthy node)
    nodes = [Node(tmp, router, "cpu-a", None, *PATIENT_PROBES, "--node-label", "pool=small")]
    try:
        wait_for(
            lambda: default_row(router).get("seats") == 1, "cpu-a ready", 90.0, detail=router.log
        )
        nodes.append(
            Node(tmp, router, "h100-a", other, *PATIENT_PROBES, "--node-label", "pool=big")
        )
        wait_for(
            lambda: [k["seats"] for k in fleet_status(router).get("kinds", [])] == [1, 1],
            "both nodes ready with a seat",
            90.0,
            detail=router.log,
        )
        yield router
    finally:
        for node in nodes:
            node.stop()
        router.stop()


def test_kcoral_status_through_a_router_shows_the_fleet_table(
    fleet: RouterProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KCORAL_URL", raising=False)
    monkeypatch.delenv("KCORAL_TOKEN", raising=False)
    # The supervisor reports the cell's run with its next status, and its seat free in that
    # one or a later one: the worker cleans up after its program before it takes another,
    # so a status can count the program while its seat is still busy (est. wait not 0).
    wait_reported = (
        "import json, time, urllib.request\n"
        "def settled():\n"
        f"    with urllib.request.urlopen({fleet.url!r} + '/v1/info') as answer:\n"
        "        kinds = json.load(answer)['fleet_status']['kinds']\n"
        "    free = all(kind['free_seats'] == kind['seats'] for kind in kinds)\n"
        "    return free and kinds[0]['recent_programs'] >= 1\n"
        "while not settled():\n"
        "    time.sleep(0.1)\n"
    )
    sources = [
        "%load_ext kcoral",
        f"%kcoral connect {fleet.url}",
        "%%kcoral\n1 + 1\n",  # 2: runs on the default kind's node
        wait_reported,
        "%kcoral status",  # 4
        "%%kcoral --select gpu\n1\n",  # 5: refused before anything is sent
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    NotebookClient(
        notebook,
        timeout=120,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": tmp_path}},
    ).execute()
    cells = notebook.cells
    assert "2" in shown(cells[2])
    assert not [o for o in cells[3].outputs if o.output_type == "error"], shown(cells[3])
    status = cells[4]
    tables = [o for o in status.outputs if "data" in o]
    assert len(tables) == 2, status.outputs  # the rows, then the fleet table
    rows_text = tables[0]["data"]["text/plain"]
    assert "info.fleet:" not in rows_text and "info.device: cpu" in rows_text
    lines = tables[1]["data"]["text/plain"].splitlines()
    assert lines[0].split("  ")[0] == "fleet" and lines[0].endswith("est. wait")
    cells_of = {line.split("  ")[0]: line.split() for line in lines[1:]}
    # default kind: 1 node, its seat free, nothing queued, one recent program: no wait
    assert cells_of["gpu=cpu (default)"][-7:] == ["1", "1", "of", "1", "0", "0", "s"]
    # the other kind never ran a program: no estimate
    assert cells_of["gpu=h100 sm_90a x1"][-6:] == ["1", "1", "of", "1", "0", "\u2014"]
    assert set(cells_of) == {"gpu=cpu (default)", "gpu=h100 sm_90a x1", "pool=big", "pool=small"}
    html = tables[1]["data"]["text/html"]
    assert "<th>est. wait</th>" in html and "gpu=h100 sm_90a x1" in html
    # IPython says a magic's UsageError on stderr, in one line
    refused = shown(cells[5], tracebacks=False)
    assert "UsageError: %%kcoral: argument --select: selector part 'gpu' must be key=value" in (
        refused
    ), refused


@contextlib.contextmanager
def the_default_seat_held(fleet: RouterProcess, release: Path) -> Iterator[None]:
    """A program holds cpu-a's one seat until ``release`` exists (written on the way out)."""
    holder = threading.Thread(
        target=post_execute, args=(fleet.url, call_program(HOLD, args=[str(release)]))
    )
    holder.start()
    try:
        wait_for(
            lambda: default_row(fleet).get("free_seats") == 0,
            "the seat held",
            90.0,
            detail=fleet.log,
        )
        yield
    finally:
        release.write_text("go")
        holder.join(120)


def test_a_cell_queued_at_the_router_says_it_waits_for_the_default_kind(
    fleet: RouterProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = tmp_path / "release"
    with the_default_seat_held(fleet, release):
        ticked = "kcoral: submitting, waiting for gpu=cpu · 1 s"
        seen_lines: list[str] = []

        def release_once_queued_a_second() -> None:
            try:
                wait_for(
                    lambda: default_row(fleet).get("queued") == 1,
                    "the cell queued",
                    90.0,
                    detail=fleet.log,
                )
                # its held line says how long it has waited, as every other waiting line does
                wait_for(
                    lambda: ticked in seen_lines, "the held line ticked", 30.0, detail=fleet.log
                )
            finally:  # a line that never ticks fails below, not by the cell held forever
                release.write_text("go")

        releaser = threading.Thread(target=release_once_queued_a_second)
        with kcoral_shell(fleet.url, monkeypatch, ("_kcoral",)) as ip, capture_output() as seen:
            publish = ip.display_pub.publish

            def noted(data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
                seen_lines.append(data.get("text/plain", ""))
                publish(data, *args, **kwargs)

            ip.display_pub.publish = noted
            releaser.start()
            try:
                result = ip.run_cell("%%kcoral\n40 + 2\n")
            finally:
                del ip.display_pub.publish
        releaser.join(120)
        assert result.error_in_exec is None, result.error_in_exec
        lines = [o.data.get("text/plain", "") for o in seen.outputs]
        assert lines[:2] == ["kcoral: submitting, waiting for gpu=cpu", ticked], lines
        assert result.result == 42


def test_a_bad_select_sends_nothing(fleet: RouterProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    before = len(Client(fleet.url).jobs())
    with kcoral_shell(fleet.url, monkeypatch, ()) as ip:
        for line in ("%%kcoral --select gpus=two", "%%kcoral --select =h100"):
            with pytest.raises(UsageError, match="argument --select"):
                ip.run_cell_magic("kcoral", line.removeprefix("%%kcoral "), "1\n")
        with pytest.raises(UsageError, match="argument --select"):
            ip.run_line_magic("kcoral", "session start --select gpu")
    assert len(Client(fleet.url).jobs()) == before


def test_select_runs_a_cell_on_the_chosen_kinds_node(
    fleet: RouterProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = fleet.lines_after_mark()
    with kcoral_shell(fleet.url, monkeypatch, ("_kcoral",)) as ip, capture_output() as seen:
        result = ip.run_cell("%%kcoral --select gpu=h100\nimport os\nos.environ.get('X', 1)\n")
    assert result.error_in_exec is None, result.error_in_exec
    lines = fleet.log().splitlines()[before : fleet.lines_after_mark()]  # the cell's, all in
    served = [line for line in lines if "request_finished" in line]
    assert any("node=h100-a" in line for line in served), served[-5:]
    assert "· node h100-a ·" in seen.outputs[-1].data["text/plain"]  # the summary says where


def test_a_cell_queued_for_a_selected_kind_says_so_and_only_that_row_counts_it(
    fleet: RouterProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = tmp_path / "release"
    hold = call_program(HOLD, args=[str(release)])
    selected = {"headers": {"X-KCoral-Select": "gpu=h100"}}
    holder = threading.Thread(target=post_execute, args=(fleet.url, hold), kwargs=selected)
    holder.start()

    def h100_row() -> dict[str, Any]:
        return next(k for k in fleet_status(fleet).get("kinds", []) if k["gpu"] == "h100")

    try:
        wait_for(
            lambda: h100_row()["free_seats"] == 0, "h100-a's seat held", 90.0, detail=fleet.log
        )
        seen_rows: list[dict[str, Any]] = []

        def release_once_queued() -> None:
            wait_for(
                lambda: h100_row()["queued"] == 1,
                "the cell queued for h100",
                90.0,
                detail=fleet.log,
            )
            seen_rows.append(fleet_status(fleet))
            release.write_text("go")

        releaser = threading.Thread(target=release_once_queued)
        releaser.start()
        with kcoral_shell(fleet.url, monkeypatch, ("_kcoral",)) as ip, capture_output() as seen:
            result = ip.run_cell("%%kcoral --select gpu=h100\n40 + 2\n")
        releaser.join(120)
        assert result.error_in_exec is None, result.error_in_exec
        lines = [o.data.get("text/plain", "") for o in seen.outputs]
        assert "kcoral: submitting, waiting for gpu=h100" in lines, lines
        (rows,) = seen_rows
        queued = {(k["gpu"], k["queued"]) for k in rows["kinds"]}
        assert queued == {("cpu", 0), ("h100", 1)}  # the cpu row is not asked for
        labels = {(r["value"], r["queued"]) for r in rows["labels"]}
        assert labels == {("big", 1), ("small", 0)}
    finally:
        release.write_text("go")
        holder.join(120)


def test_a_session_started_with_select_runs_its_cells_on_that_kind(
    fleet: RouterProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    with kcoral_shell(fleet.url, monkeypatch, ("_kcoral", "x")) as ip, capture_output():
        ip.run_line_magic("kcoral", "session start --select gpu=h100")
        try:
            first = ip.run_cell("%%kcoral\nx = 20\n")
            second = ip.run_cell("%%kcoral\nx * 2 + 2\n")
        finally:
            ip.run_line_magic("kcoral", "session stop")
    assert first.error_in_exec is None and second.error_in_exec is None, second.error_in_exec
    assert second.result == 42
    lines = [line for line in fleet.log().splitlines() if "/v1/sessions" in line]
    served = [line.split("node=")[1].split()[0] for line in lines if "node=" in line]
    assert served and set(served) == {"h100-a"}, lines[-5:]


def test_an_interrupted_cell_held_at_the_router_leaves_its_queue_and_makes_no_job(
    fleet: RouterProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The submission runs on a thread of its own (kcoral_jupyter.submission): an interrupt
    # left it held at the router, to become a job nobody follows once the seat freed.
    with the_default_seat_held(fleet, tmp_path / "release"):
        jobs_before = len(Client(fleet.url).jobs())

        def interrupt_once_queued() -> None:
            wait_for(
                lambda: default_row(fleet).get("queued") == 1,
                "the cell queued",
                90.0,
                detail=fleet.log,
            )
            _thread.interrupt_main()  # the kernel's interrupt button

        interrupter = threading.Thread(target=interrupt_once_queued)
        with kcoral_shell(fleet.url, monkeypatch, ("_kcoral",)) as ip, capture_output():
            interrupter.start()
            result = ip.run_cell("%%kcoral --noblock\n40 + 2\n")
        interrupter.join(120)
        assert isinstance(result.error_in_exec, KeyboardInterrupt), result.error_in_exec
        # the router dropped it while the seat is still held (it stayed queued: a hang guard)
        wait_for(
            lambda: default_row(fleet).get("queued") == 0,
            "the cell left the queue",
            90.0,
            detail=fleet.log,
        )
        assert default_row(fleet).get("free_seats") == 0
    wait_for(
        lambda: default_row(fleet).get("free_seats") == 1,
        "the seat free again",
        90.0,
        detail=fleet.log,
    )
    assert len(Client(fleet.url).jobs()) == jobs_before
