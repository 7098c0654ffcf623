"""Security of the file API and of client authentication, against real servers.

The workspace is not a sandbox (SERVER.md §7): uploaded code may do anything the server user
may. What the *file API* (file uploads, file/folder returns) promises is narrower and tested
here: no path leaves the workspace, no symlink is followed (even one planted by an earlier
instruction), and one request cannot reach another's workspace or the disk cache through it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from reliability_support import (
    TRIVIAL,
    check_documented,
    check_error,
    exchange,
    execute,
    get,
    post_execute,
    request_bytes,
    sha256,
)
from waiting import wait_until

SECRET = b"top secret\n"
DATA = b"payload\n"

PLANTER = """
import os
def link(target, name):
    parent = os.path.dirname(name)
    if parent:
        os.makedirs(parent, exist_ok=True)
    os.symlink(target, name)
    return name
def hold(marker, release):
    with open("secret.txt", "w") as f:
        f.write("top secret\\n")
    with open(marker + ".tmp", "w") as f:
        f.write(os.getcwd())
    os.rename(marker + ".tmp", marker)
    import time
    while not os.path.exists(release):
        time.sleep(0.02)
    return 1
def identity(x):
    return x
"""


def planted(target: str, name: str, *after: dict) -> dict:
    """Plant symlink ``name -> target`` in the workspace, then run ``after``."""
    return {
        "instructions": [
            {"op": "upload", "id": "m", "kind": "module", "source": PLANTER},
            {"op": "get_function", "id": "link", "module": {"$ref": "m"}, "name": "link"},
            {"op": "run", "id": "l", "fn": {"$ref": "link"}, "args": [target, name]},
            *after,
        ]
    }


def failed_at(answer, index: int, kind: str) -> dict:
    check_documented(answer)
    assert answer.body["status"] == "FAILED", answer.body
    error = answer.body["error"]
    assert (error["instruction_index"], error["kind"]) == (index, kind), error
    assert not answer.parts, "a refused return must not send any bytes"
    return error


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    directory = tmp_path / "outside"
    directory.mkdir()
    (directory / "secret.txt").write_bytes(SECRET)
    return directory


@pytest.fixture
def server(watched_server):
    return watched_server("--num-workers", "2")


@pytest.mark.parametrize(
    "path", ["../escape.txt", "/tmp/escape.txt", "a/../../escape.txt", "a\\..\\x", "./..", "a/\x00"]
)
def test_traversing_paths_are_refused_before_anything_runs(server, path) -> None:
    upload = {"op": "upload", "kind": "file", "path": path, "blob": sha256(DATA)}
    check_error(execute(server.url, {"instructions": [upload]}, [DATA]), 400, "parse")
    for kind in ("file", "folder"):
        back = {"op": "return", "key": "k", "kind": kind, "path": path}
        check_error(execute(server.url, {"instructions": [back]}), 400, "parse")


def test_an_upload_through_a_planted_directory_symlink_is_refused(server, outside) -> None:
    upload = {"op": "upload", "kind": "file", "path": "inputs/x.txt", "blob": sha256(DATA)}
    answer = execute(server.url, planted(str(outside), "inputs", upload), [DATA])
    failed_at(answer, 3, "runtime")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_an_upload_onto_a_planted_file_symlink_is_refused(server, outside) -> None:
    upload = {"op": "upload", "kind": "file", "path": "x.txt", "blob": sha256(DATA)}
    answer = execute(server.url, planted(str(outside / "secret.txt"), "x.txt", upload), [DATA])
    failed_at(answer, 3, "runtime")
    assert (outside / "secret.txt").read_bytes() == SECRET


@pytest.mark.parametrize(
    ("name", "target_in", "returned", "kind"),
    [
        ("leak", "secret.txt", "leak", "file"),
        ("d", "", "d/secret.txt", "file"),
        ("d", "", "d", "folder"),
        ("box/inner", "", "box", "folder"),
    ],
)
def test_returns_never_follow_a_planted_symlink(
    server, outside, name, target_in, returned, kind
) -> None:
    target = str(outside / target_in) if target_in else str(outside)
    back = {"op": "return", "key": "k", "kind": kind, "path": returned}
    error = failed_at(execute(server.url, planted(target, name, back)), 3, "serialization")
    assert "top secret" not in error["message"]


def test_a_path_supplied_at_run_time_cannot_leave_the_workspace(server, outside) -> None:
    for path in (str(outside / "secret.txt"), "../secret.txt", "a/../../x"):
        program = {
            "instructions": [
                {"op": "upload", "id": "m", "kind": "module", "source": PLANTER},
                {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "identity"},
                {"op": "run", "id": "p", "fn": {"$ref": "f"}, "args": [path]},
                {"op": "return", "key": "k", "kind": "file", "path": {"$ref": "p"}},
            ]
        }
        failed_at(execute(server.url, program), 3, "serialization")


def test_one_request_cannot_reach_another_workspace_or_the_disk_cache(server, tmp_path) -> None:
    # Request A keeps its workspace (with a secret) alive until released.
    marker, release = tmp_path / "workspace", tmp_path / "release"
    holder = {
        "instructions": [
            {"op": "upload", "id": "m", "kind": "module", "source": PLANTER},
            {"op": "get_function", "id": "h", "module": {"$ref": "m"}, "name": "hold"},
            {"op": "run", "id": "r", "fn": {"$ref": "h"}, "args": [str(marker), str(release)]},
        ]
    }
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(a=execute(server.url, holder)))
    thread.start()
    try:
        assert wait_until(marker.exists, 30)
        other = Path(marker.read_text())
        assert other.stat().st_mode & 0o077 == 0, oct(other.stat().st_mode)
        # Warm the disk cache with a file blob, then try to reach its stored copy.
        warm = {
            "instructions": [{"op": "upload", "kind": "file", "path": "f", "blob": sha256(DATA)}]
        }
        assert execute(server.url, warm, [DATA]).body["status"] == "COMPLETED"
        cached = next(server.disk_cache_dir.rglob(sha256(DATA)))
        for target, returned, kind in (
            (str(other / "secret.txt"), "s", "file"),
            (str(other), "w", "folder"),
            (str(cached), "c", "file"),
            (str(cached.parent.parent), "v", "folder"),
        ):
            back = {"op": "return", "key": "k", "kind": kind, "path": returned}
            failed_at(execute(server.url, planted(target, returned, back)), 3, "serialization")
        name = f"../{other.name}/secret.txt"
        back = {"op": "return", "key": "k", "kind": "file", "path": name}
        check_error(execute(server.url, {"instructions": [back]}), 400, "parse")
    finally:
        release.write_text("")
        thread.join(60)
    assert outcome["a"].body["status"] == "COMPLETED"


# ------------------------------------------------------------------ client authentication

TOKEN = "s3cr3t-token-0123456789abcdef"
AUTH = [("Authorization", f"Bearer {TOKEN}")]


@pytest.fixture
def guarded(watched_server):
    server = watched_server(env={"KCORAL_AUTH_TOKEN": TOKEN}, warm_up=False)
    return server


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        f"Bearer {TOKEN[:-1]}",
        f"Bearer {TOKEN}x",
        f"bearer{TOKEN}",
        TOKEN,
        f"Basic {TOKEN}",
    ],
)
def test_a_missing_or_wrong_token_is_a_401_and_nothing_runs(guarded, header, tmp_path) -> None:
    marker = tmp_path / "ran"
    program = {
        "instructions": [
            {"op": "upload", "id": "m", "kind": "module", "source": f"open({str(marker)!r}, 'w')\n"}
        ]
    }
    headers = [] if header is None else [("Authorization", header)]
    answer = execute(guarded.url, program, headers=headers)
    check_error(answer, 401, "unauthorized")
    assert TOKEN not in answer.raw.decode()
    assert not marker.exists()


def test_the_token_is_checked_before_the_size_limit_and_everything_else(guarded) -> None:
    raw = request_bytes("POST", "/execute", None, [("Content-Type", "text/plain")])
    raw = raw.replace(b"\r\n\r\n", b"\r\nContent-Length: 99999999999\r\n\r\n")
    check_error(exchange(guarded.url, raw), 401, "unauthorized")
    for path in ("/v1/info", "/nowhere"):
        answer = get(guarded.url, path)
        assert answer.status == 401 and answer.body["error"]["kind"] == "unauthorized"


def test_health_stays_public_and_a_good_token_works(guarded) -> None:
    assert get(guarded.url, "/health").status == 200
    assert get(guarded.url, "/internal/worker-status").status == 200
    info = get(guarded.url, "/v1/info", AUTH)
    assert info.status == 200 and "auth" in info.body["features"]
    assert TOKEN not in info.raw.decode()
    answer = execute(guarded.url, TRIVIAL, headers=AUTH)
    assert answer.body["status"] == "COMPLETED"


def test_the_token_never_reaches_logs_or_messages(guarded) -> None:
    execute(guarded.url, TRIVIAL, headers=AUTH)
    execute(guarded.url, TRIVIAL, headers=[("Authorization", f"Bearer {TOKEN}{TOKEN}")])
    post_execute(guarded.url, b"junk", "text/plain", headers=AUTH)
    guarded.stop()
    texts = [guarded.stderr()]
    texts += [p.read_text(errors="replace") for p in guarded.log_dir.rglob("*") if p.is_file()]
    assert texts and not any(TOKEN in text for text in texts)


def _start(args: list[str], tmp_path: Path, env: dict[str, str] | None = None):
    ready = tmp_path / "ready"
    command = [
        sys.executable, "-m", "kcoral", "server", "--device", "cpu", "--sandbox", "none",
        "--port", "0", "--ready-file", str(ready), "--log-dir", str(tmp_path / "logs"),
        "--disk-cache-dir", str(tmp_path / "cache"), *args,
    ]  # fmt: skip
    full_env = {
        k: v for k, v in os.environ.items() if k not in ("KCORAL_AUTH_TOKEN", "KCORAL_TOKEN")
    }
    return subprocess.Popen(
        command, env={**full_env, **(env or {})}, stderr=subprocess.PIPE, cwd=tmp_path
    ), ready


def test_a_non_loopback_address_without_a_token_is_refused_at_start(tmp_path) -> None:
    process, ready = _start(["--host", "0.0.0.0"], tmp_path)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode != 0 and not ready.exists()
    assert b"--allow-unauthenticated" in stderr


def test_allow_unauthenticated_starts_with_a_warning_event(tmp_path) -> None:
    process, ready = _start(["--host", "0.0.0.0", "--allow-unauthenticated"], tmp_path)
    try:
        assert wait_until(lambda: ready.exists() or process.poll() is not None, 60)
        assert ready.exists(), process.communicate(timeout=10)[1][-2000:]
        events = "".join(p.read_text() for p in (tmp_path / "logs").rglob("events.jsonl"))
        assert '"unauthenticated_access"' in events and '"WARNING"' in events
    finally:
        process.terminate()
        process.communicate(timeout=60)


def test_a_non_loopback_address_with_a_token_file_starts(tmp_path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    process, ready = _start(["--host", "0.0.0.0", "--auth-token-file", str(token_file)], tmp_path)
    try:
        assert wait_until(lambda: ready.exists() or process.poll() is not None, 60)
        assert ready.exists()
        url = ready.read_text().strip().replace("0.0.0.0", "127.0.0.1")
        check_error(execute(url, TRIVIAL), 401, "unauthorized")
        assert execute(url, TRIVIAL, headers=AUTH).body["status"] == "COMPLETED"
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=60)
    assert TOKEN.encode() not in stderr


def _stderr_once_ready(args: list[str], tmp_path, env: dict[str, str] | None = None) -> str:
    """What a server started with ``args`` printed by the time it was ready and stopped."""
    process, ready = _start(args, tmp_path, env)
    try:
        assert wait_until(lambda: ready.exists() or process.poll() is not None, 60)
        assert ready.exists(), process.communicate(timeout=10)[1][-2000:]
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=60)
    return stderr.decode()


def test_a_loopback_server_without_a_token_says_at_start_who_can_reach_it(tmp_path) -> None:
    # Loopback keeps web pages out, not the machine's other users: the README's plain
    # `kcoral server` on a shared GPU box let any of them run programs as its user, and
    # nothing said so.
    stderr = _stderr_once_ready([], tmp_path)
    line = next(x for x in stderr.splitlines() if "unauthenticated_access" in x)
    assert " INFO " in line and "host=127.0.0.1" in line, line
    assert line.endswith(
        "message=no client token: any local user can run programs as this server's user;"
        " on a shared machine, give --auth-token-file"
    ), line


def test_a_token_in_the_clients_variable_is_said_not_to_protect_the_server(tmp_path) -> None:
    # `KCORAL_TOKEN=s3cret kcoral server` (the clients' variable) started a server that
    # asked no token of anyone, its user believing it did
    stderr = _stderr_once_ready([], tmp_path, {"KCORAL_TOKEN": TOKEN})
    line = next(x for x in stderr.splitlines() if "unauthenticated_access" in x)
    assert " WARNING " in line and TOKEN not in stderr, line
    assert line.endswith(
        "message=KCORAL_TOKEN is set but only clients read it: no token is required; give it"
        " as KCORAL_AUTH_TOKEN or --auth-token-file"
    ), line


def test_a_loopback_server_with_a_token_says_nothing_of_unauthenticated_access(tmp_path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    stderr = _stderr_once_ready(["--auth-token-file", str(token_file)], tmp_path)
    assert "unauthenticated_access" not in stderr
