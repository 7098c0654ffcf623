"""Attack: a sandboxed program reads the server's own files through a read-only bind (audit F3).

``kcoral server`` started in an editable checkout keeps its default ``--log-dir logs`` in
the checkout, which the sandbox binds read-only (the package's source tree), as it binds
every ``PYTHONPATH`` entry and ``--sandbox-readonly-path``. Every sandboxed program then
read every identity's program sources (``logs/runs/*/programs/*.json``) and events: only
the token file was hidden. Now each file and directory the server keeps for itself that a
bind would expose is covered: the event log, the disk cache, the token file, the ready file.
Here bob's program searches the whole bound tree after alice's program ran.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from identity_support import TOKEN_A, TOKEN_B, TOKEN_LINES, execute, sha256, token_file
from kcoral_server.processes import sandbox
from server_process import start_server

BWRAP_PROBLEM = sandbox.probe()
SECRET_SOURCE = "alice-source-secret-7d1e"
SECRET_FILE = b"alice-file-secret-42c9"
ALICE = f"""
SECRET = {SECRET_SOURCE!r}

def main():
    print(SECRET)
    with open("in.bin", "rb") as handle:
        return handle.read().decode()
"""
SEARCH = """
import json, os

def read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read().decode(errors="replace")
    except OSError as exc:
        return "unreadable: " + exc.__class__.__name__

def main(top, skipped):
    found = {}
    folders = [top]
    while folders:
        folder = folders.pop()
        try:
            names = sorted(os.listdir(folder))
        except OSError as exc:
            found[folder + "/"] = "unlistable: " + exc.__class__.__name__
            continue
        found[folder + "/"] = names
        for name in names:
            path = os.path.join(folder, name)
            if os.path.isdir(path) and not os.path.islink(path):
                folders.append(path)
            elif name not in skipped:
                found[path] = read(path)
    return json.dumps(found)
"""


def _call(source: str, args: list, uploads: list[dict] | None = None) -> dict:
    return {
        "instructions": [
            *(uploads or []),
            {"op": "upload", "id": "m", "kind": "module", "source": source},
            {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "main"},
            {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": args},
            {"op": "return", "key": "r", "value": {"$ref": "r"}},
        ]
    }


def _value(answer) -> object:
    assert answer.status == 200, answer.raw[:2000]
    body = answer.json
    assert body["status"] == "COMPLETED", body
    return body["results"]["r"]["value"]


@pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=f"bubblewrap unusable: {BWRAP_PROBLEM}")
@pytest.mark.parametrize("bound_by", ["PYTHONPATH", "--sandbox-readonly-path"])
def test_a_sandboxed_program_cannot_list_or_read_the_servers_files_under_a_readonly_bind(
    tmp_path: Path, bound_by: str
) -> None:
    # a project directory on the import path, the server started in it with its own files
    # there: the default --log-dir (relative: ``logs``), the disk cache, the token file
    # and the ready file
    project = tmp_path / "project"
    project.mkdir()
    (project / "helper.py").write_text("VALUE = 1\n")
    server_dir = project / "server"
    tokens = token_file(project / "secrets", TOKEN_LINES)
    args = ["--sandbox", "bubblewrap", "--auth-token-file", str(tokens), "--log-dir", "logs"]
    env = {}
    if bound_by == "PYTHONPATH":
        env["PYTHONPATH"] = os.pathsep.join([str(project), os.environ.get("PYTHONPATH", "")])
    else:
        args += ["--sandbox-readonly-path", str(project)]
    server = start_server(server_dir, args, env=env)
    try:
        log_dir = server_dir / "logs"
        assert list(log_dir.glob("runs/*/events.jsonl"))
        alice = _call(
            ALICE,
            [],
            [{"op": "upload", "kind": "file", "blob": sha256(SECRET_FILE), "path": "in.bin"}],
        )
        sent = execute(server.url, alice, TOKEN_A, {sha256(SECRET_FILE): SECRET_FILE})
        assert _value(sent) == SECRET_FILE.decode()
        assert any(SECRET_SOURCE in p.read_text() for p in log_dir.glob("runs/*/programs/*"))
        assert list(server.disk_cache_dir.rglob("*")), "the file blob is in the disk cache"
        # the console is the test's redirect, not a file the server writes
        search = _call(SEARCH, [str(project), ["server.stderr"]])
        found = json.loads(_value(execute(server.url, search, TOKEN_B)))
    finally:
        server.stop()
    leaks = {
        path: text
        for path, text in found.items()
        if any(
            secret in str(text)
            for secret in (SECRET_SOURCE, SECRET_FILE.decode(), TOKEN_A, TOKEN_B, "request_id")
        )
    }
    assert leaks == {}
    assert found[f"{log_dir}/"] == []  # an empty directory where the log is
    assert found[f"{server.disk_cache_dir}/"] == []
    # covered by /dev/null (which a bind makes unopenable: nodev)
    covered = ("", "unreadable: PermissionError")
    assert found[str(tokens)] in covered
    # bob's sandbox directory was made after the ready file (another identity's): hidden too
    assert found[str(server_dir / "ready")] in covered
    assert found[str(project / "helper.py")] == "VALUE = 1\n"  # what is meant to be seen
