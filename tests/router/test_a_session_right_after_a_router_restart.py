"""What a session's user sees when the router in front of it restarts (SIGTERM, started
again on its port, as systemd does) and the next program goes out at once: the restarted
router answers 503 ``session not found yet`` (``Retry-After: 1``, ROUTER §13) until the
session's node has reconnected, about a second, and the client asks again (EXTENSIONS §11).
Before, that program failed with the 503 for what was a one-second wait. A real router and
a real CPU node; ``test_router_restart_grace.py`` holds the same scene's other checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from router_helpers import router_with_a_node, stopping
from test_router_restart_grace import (
    NODE_ENV,
    RECALL,
    REMEMBER,
    TOKEN,
    router_on,
    session_call,
)

import kcoral
from kcoral.client_sessions import FIND_WAIT_SECONDS

pytestmark = pytest.mark.slow

WAIT_LINE = (
    "the router just started and has not found it yet (its node may be reconnecting); asking "
    f"again for up to {FIND_WAIT_SECONDS:.0f} s"
)


@pytest.mark.parametrize("picked_up", ["kept", "attached"])
def test_a_session_program_sent_right_after_a_router_restart_runs_once_its_node_is_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], picked_up: str
) -> None:
    with router_with_a_node(tmp_path, f"alice {TOKEN}\n", NODE_ENV) as router:
        with kcoral.Client(router.url, token=TOKEN) as client:
            session = client.session()
            assert session.execute(session_call(REMEMBER, 41))["value"] == 41
            router.stop()  # SIGTERM, then the same command on the same port
            restarted = router_on(tmp_path, router.port)
            with stopping(restarted, []):  # stopped however the block ends
                # at once: its node has not reconnected yet; "attached" picks the session
                # up first, as `%kcoral session attach` in a restarted kernel does
                if picked_up == "attached":
                    session = client.attach_session(session.id)
                assert session.execute(session_call(RECALL))["value"] == 41
                session.close()
    # a wait past a moment says so, once, in one line (a shorter one says nothing)
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("kcoral:")]
    assert said in ([], [f"kcoral: session {session.id[:8]}: {WAIT_LINE}"])
