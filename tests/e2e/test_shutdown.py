"""Graceful shutdown (SERVER §12) seen from clients."""

from __future__ import annotations

import signal
import threading

import pytest
from e2e_support import health, module_program, wait_for

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
    wait_for(lambda: health(server.url)["load"]["requests_in_progress"] == 1, what="running")
    server.process.send_signal(signal.SIGTERM)
    server.process.send_signal(signal.SIGTERM)  # repeated signals never force an exit
    wait_for(lambda: "shutdown_started" in {e["event"] for e in server.events()}, what="drain")
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
