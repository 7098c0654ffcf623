"""Graceful shutdown (SERVER §12) seen from clients."""

from __future__ import annotations

import signal
import threading

import pytest
from e2e_support import health, module_program
from waiting import wait_for

import kcoral


@pytest.mark.slow
def test_sigterm_lets_a_running_request_finish_refuses_new_ones_and_exits_zero(
    server_factory,
):
    server = server_factory("--num-workers", "2")
    outcome: dict[str, object] = {}
    source = (
        "import time\ndef slow():\n    time.sleep(3)\n    print('done')\n    return 'finished'\n"
    )

    def run() -> None:
        with kcoral.Client(server.url) as c:
            outcome["result"] = c.execute(module_program(source, "slow"))

    thread = threading.Thread(target=run)
    thread.start()
    wait_for(lambda: health(server.url)["load"]["requests_in_progress"] == 1, "running", 60.0)
    server.process.send_signal(signal.SIGTERM)
    server.process.send_signal(signal.SIGTERM)  # repeated signals never force an exit
    wait_for(lambda: "shutdown_started" in {e["event"] for e in server.events()}, "drain", 60.0)
    try:
        with kcoral.Client(server.url) as c:
            c.execute(module_program("def f():\n    return 1\n", "f"))
    except kcoral.KCoralError as exc:
        assert (exc.status_code, exc.kind) == (503, "busy")
        assert exc.message == "server saturated: the server is shutting down"
    except kcoral.TransportError:
        pass  # the listener may already be closed
    else:
        pytest.fail("a request admitted after SIGTERM")
    thread.join(60)
    result = outcome["result"]
    assert result.completed and result["out"] == "finished" and result.stdout == "done\n"
    assert server.process.wait(60) == 0
    events = [e["event"] for e in server.events()]
    assert events.index("shutdown_started") < events.index("shutdown_complete")
    assert events[-1] == "server_stopped"
    started = next(e for e in server.events() if e["event"] == "shutdown_started")
    assert started["remaining"] == 1
    assert "Shutdown requested. Finishing remaining benchmarks: 1 left." in server.stderr()


@pytest.mark.slow
def test_a_drain_while_every_gpu_seat_runs_a_program_ends_with_spare_workers_on(
    server_factory,
):
    """One fresh worker per program keeps a spare per seat (SERVER §6). A worker that
    retired as the drain began still held its GPU's lease while its seat's spare, never
    handed over, was killed under that lease first: shutdown waited for ever after
    ``shutdown_waiting remaining=0`` (fleet soak, 4 of 5 runs on 4 fake GPUs)."""
    server = server_factory(
        "--device", "fake-gpu", "--fake-gpu-count", "4", "--workers-per-gpu", "1",
        "--max-requests-per-worker", "1", "--sandbox", "auto", "--worker-preload", "none",
    )  # fmt: skip
    source = "import time\ndef slow():\n    time.sleep(4)\n    return 'finished'\n"
    results: list[object] = []

    def run() -> None:
        with kcoral.Client(server.url) as c:
            results.append(c.execute(module_program(source, "slow")))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    wait_for(lambda: health(server.url)["load"]["requests_in_progress"] == 4, "4 running", 60.0)
    # each seat's spare forked in its other sandbox: 4 seats x 2 sandboxes x (fork server
    # and its worker) launcher processes
    wait_for(lambda: launcher_processes(server.process.pid) == 16, "4 spares started", 60.0)
    server.process.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(60)
    assert [getattr(r, "completed", None) for r in results] == [True] * 4
    assert server.process.wait(60) == 0  # a hang guard: it used to never exit
    assert server.events()[-1]["event"] == "server_stopped"


def launcher_processes(pid: int) -> int:
    """How many of ``pid``'s descendants run the worker launcher (fork servers, workers;
    not the ``bwrap`` processes that start them)."""
    import psutil

    count = 0
    for child in psutil.Process(pid).children(recursive=True):
        try:
            command = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        launcher = "kcoral_server.processes.launcher" in command
        count += launcher and "bwrap" not in command[0]
    return count


@pytest.mark.slow
def test_a_job_cancelled_during_the_drain_tells_its_follower_it_was_cancelled(server_factory):
    """A cell follows its job while the KCoral panel cancels it during a drain. A cancelled
    job counted as having no result to read, so the server exited as soon as it ended and
    the cell, reading the result after the job's last event, said ``Connection refused``
    (lab soak). The drain now waits for that read too, and says so."""
    server = server_factory()
    source = "import time\ndef slow():\n    time.sleep(300)\n"
    with kcoral.Client(server.url) as client:
        job = client.submit(module_program(source, "slow"))
        wait_for(lambda: job.status()["status"] == "RUNNING", "running", 60.0)
        server.process.send_signal(signal.SIGTERM)
        wait_for(lambda: "shutdown_started" in {e["event"] for e in server.events()}, "drain", 60.0)
        with kcoral.Client(server.url) as panel:
            panel.job(job.id).cancel()
        awaiting = wait_for(
            lambda: [e for e in server.events() if e["event"] == "shutdown_awaiting_results"],
            "the wait for the cancelled job's result to be read",
            60.0,
        )
        assert awaiting[0]["unread"] == 1
        with pytest.raises(kcoral.KCoralError) as raised:
            job.result()
        assert (raised.value.status_code, raised.value.kind) == (409, "cancelled")
    assert server.process.wait(60) == 0
