"""Attack: a program reads the server's secrets (issue 16, point 3).

Before the fix a program read ``KCORAL_AUTH_TOKEN`` from ``os.environ`` with ``--sandbox
none``, and a forked worker's ``/proc/self/environ`` (the launcher's start-up environment)
held every secret of the front-end. Now, in every sandbox mode and on both launch paths
(forked from the launcher, spawned), a program finds no KCoral secret and no variable the
operator denied with ``--worker-env-deny``; under bubblewrap it cannot read the token file
or any other process's environment either.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sandbox_default_support import bwrap_problem, execute, returned, run_source
from server_process import start_server

AUTH = "auth-secret-5f0c1e9a7d"
NODE = "node-secret-9b2e44c1a0"
PRIVATE = "private-value-31c7d2"
CLOUD = "cloud-value-88a1f0"
SECRETS = (AUTH, NODE, PRIVATE, CLOUD)

# Everything a program can look at for the server's secrets without a sandbox's help:
# its environment, its own and its parent's start-up environments; under bubblewrap also
# every process it can see and the token file.
SNOOP = """
import json, os

def read(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError as exc:
        return "unreadable: " + exc.__class__.__name__

def main(token_file, everything):
    found = {"environ": dict(os.environ)}
    found["self"] = read("/proc/self/environ")
    found["parent"] = read(f"/proc/{os.getppid()}/environ")
    found["pid1"] = read("/proc/1/environ")
    if everything:
        for name in os.listdir("/proc"):
            if name.isdigit():
                found["proc" + name] = read(f"/proc/{name}/environ")
    if token_file:
        found["token_file"] = read(token_file)
    return json.dumps(found)
"""

ENV = {
    "KCORAL_AUTH_TOKEN": AUTH,
    "KCORAL_NODE_TOKEN": NODE,
    "MY_PRIVATE_KEY": PRIVATE,
    "CLOUD_SESSION": CLOUD,
}
DENY = ["--worker-env-deny", "MY_PRIVATE_KEY", "--worker-env-deny", "CLOUD_*"]


def _leaks(found: dict) -> list[str]:
    text = repr(found)
    return [secret for secret in SECRETS if secret in text]


@pytest.mark.parametrize("launch", ["fork", "spawn"])
def test_a_program_without_a_sandbox_finds_no_secret_in_its_environment(
    tmp_path: Path, launch: str
) -> None:
    env = dict(ENV, KCORAL_WORKER_LAUNCH=launch)
    server = start_server(tmp_path / "server", ["--sandbox", "none", *DENY], env=env)
    try:
        found = returned(execute(server.url, run_source(SNOOP, args=[None, False]), AUTH))
    finally:
        server.stop()
    assert _leaks(found) == [], {k: v for k, v in found.items() if _leaks({k: v})}
    assert "MY_PRIVATE_KEY" not in found["environ"]
    assert "CLOUD_SESSION" not in found["environ"]
    assert not [name for name in found["environ"] if "TOKEN" in name]
    # an ordinary variable still arrives: only secrets and denied names are taken away
    assert "PATH" in found["environ"]


@pytest.mark.skipif(bwrap_problem() is not None, reason=f"bubblewrap unusable: {bwrap_problem()}")
@pytest.mark.parametrize("launch", ["fork", "spawn"])
def test_a_sandboxed_program_reads_no_secret_anywhere(tmp_path: Path, launch: str) -> None:
    # The token file lies in a read-only path the sandbox binds, so only hiding protects it.
    shared = tmp_path / "shared"
    shared.mkdir()
    token_file = shared / "tokens"
    token_file.write_text(f"{AUTH}\n")
    os.chmod(token_file, 0o600)
    env = {k: v for k, v in ENV.items() if k != "KCORAL_AUTH_TOKEN"}
    env["KCORAL_WORKER_LAUNCH"] = launch  # fork: the seat's sandboxed fork server
    args = ["--sandbox", "bubblewrap", "--sandbox-readonly-path", str(shared), *DENY]
    server = start_server(
        tmp_path / "server", [*args, "--auth-token-file", str(token_file)], env=env
    )
    try:
        program = run_source(SNOOP, args=[str(token_file), True])
        found = returned(execute(server.url, program, AUTH))
    finally:
        server.stop()
    assert _leaks(found) == [], {k: v for k, v in found.items() if _leaks({k: v})}
    assert "MY_PRIVATE_KEY" not in found["environ"]
    # its PID namespace hides the front-end: only its own sandbox's processes are there
    assert str(server.process.pid) not in [k[4:] for k in found if k.startswith("proc")]


TAKE_OVER = """
import json, os

def main():
    parent = os.getppid()
    found = {}
    for name in ("mem", "environ"):
        try:
            with open(f"/proc/{parent}/{name}", "rb") as f:
                f.read(1)
            found[name] = "read"
        except OSError as exc:
            found[name] = exc.__class__.__name__
    with open(f"/proc/{parent}/cmdline", "rb") as f:
        found["parent"] = f.read().decode(errors="replace")
    return json.dumps(found)
"""


@pytest.mark.skipif(bwrap_problem() is not None, reason=f"bubblewrap unusable: {bwrap_problem()}")
def test_a_sandboxed_program_cannot_read_or_take_over_the_fork_server_of_its_seat(
    tmp_path: Path,
) -> None:
    # The seat's fork server shares the program's sandbox and user; without a sandbox the
    # program can do whatever the server's user can (root even more), so only this is tested.
    server = start_server(tmp_path / "server", ["--sandbox", "bubblewrap"])
    try:
        found = returned(execute(server.url, run_source(TAKE_OVER)))
    finally:
        server.stop()
    assert "kcoral_server.processes.launcher" in found["parent"], found
    assert found["mem"] == found["environ"] == "PermissionError", found
