"""Spare workers under the real sandbox (SERVER §6, §14; issue 31): each seat's next fresh
worker starts ahead in the seat's other sandbox directory, and a sandbox that ran one
identity's programs never serves another's.

The attacker is another token holder: alice leaves files in her sandbox's ``HOME`` and
``/tmp``; bob's programs, on the same single seat, must never see them, whichever of the
seat's two sandboxes (and spares) they land on.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
from alice_and_bob import completed_value, one_seat_server
from identity_support import TOKEN_A, TOKEN_B
from kcoral_server.processes import sandbox

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


def _run(url: str, token: str, source: str, args: list) -> Any:
    """What the program's ``main(*args)`` returned (a JSON text), decoded."""
    return json.loads(completed_value(url, token, source, args, timeout=90))


def _found(url: str, token: str, who: str) -> dict[str, list[str]]:
    return _run(url, token, LEAVE_A_MARK, [who])


@needs_bwrap
def test_a_spare_never_hands_one_identitys_sandbox_to_another(tmp_path: Path) -> None:
    server = one_seat_server(tmp_path)
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


# The program as the attacker of the worker forked ahead in its own sandbox (SERVER §6): it
# looks at its siblings (the processes its fork server forked besides itself) and tries to
# read what a worker-to-be keeps: its memory, its environment, its descriptors (its go
# pipe among them); or, with ``kill``, kills them. A sibling may also be the previous
# program's worker on its way out (its exit report was believed, SERVER §8): the attacker
# notes whether the kernel already marked it exiting (``PF_EXITING`` in ``stat``).
ATTACK_THE_HELD_WORKER = """
import json, os, signal

def siblings():
    me, parent = os.getpid(), os.getppid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            status = open(f"/proc/{name}/status").read()
        except OSError:
            continue
        ppid = next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:"))
        if int(ppid) == parent:
            found.append(int(name))
    return found

def exiting(pid):
    try:
        return bool(int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[6]) & 0x4)
    except OSError:
        return True  # gone

def main(kill):
    tried = {}
    for pid in siblings():
        if kill:
            os.kill(pid, signal.SIGKILL)
            continue
        outcome = {"exiting": exiting(pid)}
        for what in ("mem", "environ", "fd/0"):
            try:
                with open(f"/proc/{pid}/{what}", "rb") as f:
                    f.read(1)
                outcome[what] = "read"
            except OSError as exc:
                outcome[what] = exc.errno
        outcome["exiting"] = outcome["exiting"] or exiting(pid)  # before or after the reads
        tried[pid] = outcome
    return json.dumps(tried)
"""


def _attack(url: str, kill: bool) -> dict[str, dict[str, object]]:
    return _run(url, TOKEN_A, ATTACK_THE_HELD_WORKER, [kill])


@needs_bwrap
def test_a_program_can_neither_read_nor_stop_the_worker_forked_ahead_beside_it(
    tmp_path: Path,
) -> None:
    server = one_seat_server(tmp_path)
    try:
        tried: dict[str, dict[str, object]] = {}
        for _ in range(12):
            tried.update(_attack(server.url, kill=False))
        assert tried, "no program ever saw a worker forked ahead beside it"
        assert any(not outcome["exiting"] for outcome in tried.values()), tried
        for pid, outcome in tried.items():
            # non-dumpable until its go (a worker forked ahead) or from its exit report on
            # (the previous one, while it ends): same user, but no ptrace access; one that
            # already tears down its memory has none left to open (ESRCH), or is gone
            refused = {errno.EACCES, errno.EPERM}
            if outcome["exiting"]:
                refused |= {errno.ESRCH, errno.ENOENT}
            reads = {what: result for what, result in outcome.items() if what != "exiting"}
            assert all(result in refused for result in reads.values()), (pid, outcome)
        for _ in range(3):  # the killed worker-to-be is replaced: the seat serves on
            _attack(server.url, kill=True)
        assert _attack(server.url, kill=False) is not None
    finally:
        server.stop()
