"""Attack: another client-token holder fills the server's disk through the program log.

Every program a server accepts is stored as ``<log-dir>/runs/<run>/programs/<request-id>.json``
(SERVER §13), and a program's JSON may be as large as ``--max-request-bytes`` (256 MiB by
default). Before the bound, bob (a token holder) could send program after program and the
folder grew without end, on the disk that also holds the caches and alice's logs. Now the
folder stays under ``--log-programs-max-bytes``: the oldest stored programs make room for the
newest, and a ``programs_log_trimmed`` WARNING says so (at most one a minute). The same
holds for ``events.jsonl``, which every request adds lines to: at half of
``--log-events-max-bytes`` it becomes ``events.1.jsonl`` and a new file starts.

Bob speaks raw HTTP, as an attacker would; alice uses the real client afterwards.
"""

from __future__ import annotations

from pathlib import Path

from identity_support import TOKEN_A, TOKEN_B, execute, token_file

import kcoral

BOUND = 2 * 1024 * 1024  # --log-programs-max-bytes 2M
PROGRAMS = 20
FILLER_BYTES = 300 * 1024  # each program's source: ~300 KB, ~6 MB in all


def large_program(index: int) -> dict:
    """A valid program whose module source is mostly a comment (inline in the JSON)."""
    source = "# " + "x" * FILLER_BYTES + f"\ndef f():\n    return {index}\n"
    return {
        "instructions": [
            {"op": "upload", "kind": "module", "id": "m", "source": source},
            {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "f"},
            {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": []},
            {"op": "return", "key": "r", "value": {"$ref": "r"}},
        ]
    }


def stored_programs(log_dir: Path) -> dict[str, int]:
    """File name -> size of every stored program of the (single) run."""
    (run,) = (log_dir / "runs").iterdir()
    return {path.name: path.stat().st_size for path in (run / "programs").iterdir()}


def test_a_token_holder_flooding_programs_keeps_the_log_folder_under_its_bound(
    server_factory, tmp_path
) -> None:
    tokens = token_file(tmp_path / "secrets")
    server = server_factory("--auth-token-file", str(tokens), "--log-programs-max-bytes", "2M")

    request_ids = []
    for index in range(PROGRAMS):
        answer = execute(server.url, large_program(index), TOKEN_B)
        assert answer.status == 200, answer.raw[:500]
        assert answer.json["status"] == "COMPLETED"
        request_ids.append(answer.json["request_id"])

    stored = stored_programs(server.log_dir)
    # Without the bound all 20 stay: about 6 MB.
    assert sum(stored.values()) <= BOUND, sorted(stored.items())
    # The newest programs are the ones kept (6 of ~300 KB fit under 2 MiB; 5 to be safe).
    for request_id in request_ids[-5:]:
        assert f"{request_id}.json" in stored
    assert f"{request_ids[0]}.json" not in stored

    # The server still serves everyone, alice included.
    program = kcoral.Program()
    module = program.upload(kind="module", source="def f():\n    return 'still here'\n")
    fn = program.get_function(module=module, name="f", id="fn")
    program.return_(key="r", value=program.run(fn=fn, args=[], id="r"))
    with kcoral.Client(server.url, token=TOKEN_A) as alice:
        assert alice.execute(program).results["r"] == "still here"

    # One rate-limited warning for the whole flood, naming the bound.
    trimmed = [r for r in server.events() if r["event"] == "programs_log_trimmed"]
    assert len(trimmed) == 1, trimmed
    assert trimmed[0]["level"] == "WARNING"
    assert trimmed[0]["limit"] == BOUND
    assert trimmed[0]["removed"] >= 1 and trimmed[0]["bytes"] >= FILLER_BYTES


def test_a_token_holder_flooding_requests_keeps_the_event_files_under_their_bound(
    server_factory, tmp_path
) -> None:
    tokens = token_file(tmp_path / "secrets")
    bound = 64 * 1024
    server = server_factory("--auth-token-file", str(tokens), "--log-events-max-bytes", "64K")
    small = {
        "instructions": [
            {"op": "upload", "kind": "module", "id": "m", "source": "def f():\n    return 1\n"},
            {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "f"},
            {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": []},
            {"op": "return", "key": "r", "value": {"$ref": "r"}},
        ]
    }
    for _ in range(150):  # ~1 KiB of events each: without the bound, ~150 KiB in one file
        assert execute(server.url, small, TOKEN_B).status == 200
    (run,) = (server.log_dir / "runs").iterdir()
    sizes = {path.name: path.stat().st_size for path in run.glob("events*.jsonl")}
    assert set(sizes) == {"events.jsonl", "events.1.jsonl"}
    assert sum(sizes.values()) <= bound + 4096, sizes
    first = (run / "events.jsonl").read_text(encoding="utf-8").splitlines()[0]
    assert '"event":"events_log_rotated"' in first
