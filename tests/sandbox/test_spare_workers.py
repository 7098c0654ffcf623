"""Spare workers under the real sandbox (SERVER §6, §14; issue 31): each seat's next fresh
worker starts ahead in the seat's other sandbox directory, and a sandbox that ran one
identity's programs never serves another's.

The attacker is another token holder: alice leaves files in her sandbox's ``HOME`` and
``/tmp``; bob's programs, on the same single seat, must never see them, whichever of the
seat's two sandboxes (and spares) they land on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from kcoral_server.processes import sandbox

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "security"))

from identity_support import TOKEN_A, TOKEN_B, token_file
from raw_http import post_execute
from sandbox_helpers import run_source
from server_process import start_server

BWRAP_PROBLEM = sandbox.probe()
needs_bwrap = pytest.mark.skipif(
    BWRAP_PROBLEM is not None, reason=f"bubblewrap cannot run here: {BWRAP_PROBLEM}"
)

# Leaves a mark of ``who`` in HOME and /tmp, and says what it found there first.
LEAVE_A_MARK = """
import json, os

def main(who):
    home = os.environ["HOME"]
    found = {"home": sorted(os.listdir(home)), "tmp": sorted(os.listdir("/tmp"))}
    for folder in (home, "/tmp"):
        open(os.path.join(folder, "mark-" + who), "w").write(who)
    return json.dumps(found)
"""


def _found(url: str, token: str, who: str) -> dict[str, list[str]]:
    answer = post_execute(
        url,
        run_source(LEAVE_A_MARK, args=[who]),
        headers={"Authorization": f"Bearer {token}"},
        timeout=90,
    )
    assert answer.status == 200 and answer.body["status"] == "COMPLETED", answer.raw[-2000:]
    node = answer.body["results"]["value"]
    return json.loads(node["value"])


@needs_bwrap
def test_a_spare_never_hands_one_identitys_sandbox_to_another(tmp_path: Path) -> None:
    tokens = token_file(tmp_path / "secrets")
    server = start_server(
        tmp_path / "server",
        [
            "--sandbox", "bubblewrap", "--max-requests-per-worker", "1", "--num-workers", "1",
            "--auth-token-file", str(tokens),
        ],
    )  # fmt: skip
    try:
        order = ["alice", "bob", "bob", "alice", "bob", "alice", "alice", "bob"]
        seen = {"alice": [], "bob": []}
        for who in order:
            token = TOKEN_A if who == "alice" else TOKEN_B
            seen[who].append(_found(server.url, token, who))
        for who, other in (("alice", "bob"), ("bob", "alice")):
            for found in seen[who]:
                assert f"mark-{other}" not in found["home"], (who, found)
                assert f"mark-{other}" not in found["tmp"], (who, found)
                assert f"mark-{who}" not in found["tmp"], (who, found)  # /tmp emptied
        events = server.events()
        took_over = [e for e in events if e["event"] == "worker_ready" and e.get("started_ahead")]
        assert took_over, "no spare took over"
        reasons = [e["reason"] for e in events if e["event"] == "worker_retired"]
        assert "identity" in reasons, reasons  # a spare from the other identity's sandbox
        # the answers kept coming: the seat serves on
        assert _found(server.url, TOKEN_A, "alice")["home"] is not None
    finally:
        server.stop()
