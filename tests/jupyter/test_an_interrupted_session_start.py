"""An interrupt while ``%kcoral session start`` waits for the server (its worker starting, a
GPU's lease) is told in two lines (a second one: the first is held until the server
answers, see test_an_interrupt_as_a_session_starts.py). An in-process shell against a
stand-in server that never answers the create, so the interrupt lands while the answer is
awaited."""

from __future__ import annotations

import signal
import threading

import pytest
from IPython.utils.capture import capture_output
from kcoral_jupyter.cell_errors import CellCancelledError
from kcoral_jupyter.extension import kernel_state_of
from kcoral_jupyter.runner import HeldInterrupt
from kcoral_shell import kcoral_shell
from stand_in_http import StandIn, serving

pytestmark = pytest.mark.timeout(120)

ASKED = threading.Event()
RELEASE = threading.Event()


class SlowToStartSessions(StandIn):
    """A CPU server offering sessions whose ``POST /v1/sessions`` waits to be released."""

    def do_GET(self) -> None:
        if self.path == "/health":
            self.send_json({"status": "ok", "gpu_count": 0, "target": {}})
        else:
            self.send_json({"kcoral": "0.1.0", "protocol": 1, "features": ["jobs", "sessions"]})

    def do_POST(self) -> None:
        ASKED.set()
        RELEASE.wait(60)


def test_an_interrupt_while_a_session_starts_is_told_in_two_lines(monkeypatch) -> None:
    main = threading.get_ident()

    noted = threading.Event()
    note = HeldInterrupt._interrupted

    def noting(self: HeldInterrupt, signum: int, frame: object) -> None:
        if self.noted:
            note(self, signum, frame)  # the second: raises
        note(self, signum, frame)
        noted.set()

    monkeypatch.setattr(HeldInterrupt, "_interrupted", noting)

    def interrupt_once_asked() -> None:
        # Twice: the first is held until the server answers (one that landed as its 201
        # was read left a started session behind); the second leaves at once.
        if ASKED.wait(60):
            signal.pthread_kill(main, signal.SIGINT)
            if noted.wait(60):
                signal.pthread_kill(main, signal.SIGINT)

    with serving(SlowToStartSessions) as url, kcoral_shell(url, monkeypatch, ()) as ip:
        thread = threading.Thread(target=interrupt_once_asked)
        thread.start()
        try:
            with capture_output():
                result = ip.run_cell("%kcoral session start")
        finally:
            RELEASE.set()
            thread.join(60)
        error = result.error_in_exec
        assert isinstance(error, CellCancelledError), error
        assert error._render_traceback_() == [
            f"CellCancelledError: interrupted: no session was started on {url} (the server "
            "ends one whose start was left)",
            "%kcoral session start again to start one; %kcoral session list shows yours",
        ]
        assert kernel_state_of(ip).sessions.current is None
