"""Default memory limits that protect the machine (issue 28 point 6).

With default flags every worker cgroup, the session worker's included, had ``memory.max``
equal to all of RAM, so a balloon of a few GiB simply completed. Now each worker gets a
share of what is left after a reserve for the front-end, divided over every seat (session
seats included), and all of a front-end's workers sit under one parent limit, so the
front-end survives whatever they allocate together.
"""

from __future__ import annotations

import json

import pytest
from kcoral_server.processes import limits
from kcoral_server.settings.config import ServerConfig, physical_memory_bytes
from raw_http import request
from sandbox_helpers import execute, run_source
from server_process import start_server

MIB = 1024 * 1024
# three stateless seats and the default session seat: the smallest default share (the
# 4 GiB floor) on a machine like CI's, so the balloon stays as small as the rule allows
SEAT_ARGS = ["--num-workers", "3", "--worker-preload", "none"]
SEATS = 3 + ServerConfig().max_sessions

# The memory limit of the program's own cgroup and of its parent (the workers' parent), as
# the kernel holds them: v1 memory.limit_in_bytes or v2 memory.max.
OWN_LIMITS = """
import json, os

def _v2_mount():
    for line in open("/proc/self/mountinfo").read().splitlines():
        left, _sep, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            return left.split()[4]
    return None

def _read(path):
    try:
        value = open(path).read().strip()
    except OSError:
        return None
    return int(value) if value.isdigit() else None

def main():
    for line in open("/proc/self/cgroup").read().splitlines():
        _id, controllers, path = line.split(":", 2)
        if controllers == "memory":
            base, name = "/sys/fs/cgroup/memory" + path, "memory.limit_in_bytes"
        elif controllers == "" and _v2_mount():
            base, name = _v2_mount() + path, "memory.max"
        else:
            continue
        own = _read(os.path.join(base, name))
        if own is not None:
            parent = os.path.dirname(base)
            return json.dumps({
                "worker": own,
                "parent": _read(os.path.join(parent, name)),
                "parent_name": os.path.basename(parent),
            })
    return json.dumps(None)
"""

# Touches every page it allocates (bytearray zero-fills), in 64 MiB steps, up to ``size``.
BALLOON = """
def main(size):
    chunks = []
    while sum(len(c) for c in chunks) < size:
        chunks.append(bytearray(64 << 20))
    return "the balloon completed"
"""


def _value(answer: tuple) -> object:
    status, body, _parts = answer
    assert status == 200 and body["status"] == "COMPLETED", body
    node = body["results"]["value"]
    return json.loads(node["value"]) if node["type"] == "string" else node["value"]


def _memory_unenforced(server) -> str | None:
    for event in server.events():
        if event["event"] == "worker_limits_unenforced" and any(
            m.startswith("memory") for m in event["missing"]
        ):
            return event["message"]
    return None


def _expected() -> limits.WorkerLimits:
    """What the server computes with its default limit flags (same machine, same defaults;
    ``start_server`` reuses workers, so no seat keeps a spare)."""
    config = ServerConfig(num_workers=3, max_requests_per_worker=0)
    return limits.limits_from_config(config, {}, seats=3)


# ---------------------------------------------------------------- units


def test_the_default_share_divides_what_the_reserve_leaves_over_every_seat() -> None:
    memory = physical_memory_bytes() or 0
    workers = limits.workers_memory_bytes(cache_bytes=2 * limits.GIB)
    reserve = limits.memory_reserve(memory, 2 * limits.GIB)
    assert reserve >= limits.MIN_MEMORY_RESERVE_BYTES + 2 * limits.GIB or reserve == memory // 2
    assert workers <= memory - reserve
    share = limits.default_memory_limit(8, cache_bytes=2 * limits.GIB)
    share_bytes = max(workers // 8, min(workers, limits.MIN_DEFAULT_MEMORY_BYTES))
    assert share_bytes - 4096 < share <= share_bytes
    # a spare worker per stateless seat (issue 31) counts as a worker of its own
    assert limits.worker_seats(ServerConfig(max_sessions=0), 64) == 128
    assert limits.worker_seats(ServerConfig(max_sessions=3, spare_workers=False), 64) == 67
    assert limits.worker_seats(ServerConfig(max_sessions=3, max_requests_per_worker=0), 64) == 67


def test_a_small_machine_keeps_a_reserve_and_its_floor_never_exceeds_the_workers_memory() -> None:
    for memory in (2 * limits.GIB, 4 * limits.GIB, 8 * limits.GIB):
        reserve = limits.memory_reserve(memory)
        assert limits.MIN_MEMORY_RESERVE_BYTES <= reserve <= memory // 2
    assert limits.memory_reserve(2 * limits.GIB, cache_bytes=16 * limits.GIB) == limits.GIB
    workers = limits.workers_memory_bytes()
    assert limits.default_memory_limit(10_000) == min(workers, limits.MIN_DEFAULT_MEMORY_BYTES)


def test_session_seats_count_in_the_default_share() -> None:
    one = limits.limits_from_config(ServerConfig(max_sessions=0), {}, seats=2)
    more = limits.limits_from_config(ServerConfig(max_sessions=6), {}, seats=2)
    cache = ServerConfig().cache_capacity_bytes
    # two stateless seats, each with its spare worker, and the session seats
    assert one.memory_bytes == limits.default_memory_limit(4, cache_bytes=cache)
    assert more.memory_bytes == limits.default_memory_limit(10, cache_bytes=cache)
    assert one.all_workers_memory_bytes == limits.workers_memory_bytes(cache)
    # an explicit share is still held by the workers' parent; 0 turns memory limits off
    explicit = limits.limits_from_config(ServerConfig(worker_memory_limit_bytes=1 << 40), {})
    assert explicit.all_workers_memory_bytes == limits.workers_memory_bytes(cache)
    off = limits.limits_from_config(ServerConfig(worker_memory_limit_bytes=0), {})
    assert off.memory_bytes == off.all_workers_memory_bytes == 0


# ---------------------------------------------------------------- servers


def test_a_balloon_past_the_default_share_is_killed_and_the_front_end_keeps_serving(
    tmp_path,
) -> None:
    server = start_server(tmp_path / "server", SEAT_ARGS)  # no limit flag: the defaults
    try:
        unenforced = _memory_unenforced(server)
        if unenforced:
            pytest.skip(f"this machine cannot enforce memory limits: {unenforced}")
        own = _value(execute(server.url, run_source(OWN_LIMITS)))
        # what the kernel holds, whatever the code computes: every worker under one parent
        # that leaves at least 1 GiB to the front-end, each a share of it (or the floor)
        assert own["parent_name"].startswith("kcoral-workers-"), own
        assert own["parent"] <= (physical_memory_bytes() or 0) - 1024 * MIB, own
        assert own["worker"] <= max(own["parent"] // SEATS, 4096 * MIB), own
        expected = _expected()
        assert own["worker"] == expected.memory_bytes, own
        assert own["parent"] == expected.all_workers_memory_bytes, own
        # whatever the machine: past the share this server reports for the worker
        size = own["worker"] + 512 * MIB
        status, body, _ = execute(server.url, run_source(BALLOON, args=[size]), timeout=600)
        assert status == 200 and body["status"] == "FAILED", body
        # the worker's death names the limit in its event (h28-work: also in the answer)
        hits = [e for e in server.events() if e["event"] == "worker_limit_exceeded"]
        assert hits and str(own["worker"]) in hits[0]["message"], hits
        assert server.process.poll() is None
        assert request(server.url, "GET", "/v1/info").status == 200
        assert _value(execute(server.url, run_source("def main():\n    return 5\n"))) == 5
    finally:
        server.stop()


def test_the_session_worker_gets_the_same_share_under_the_same_parent(tmp_path) -> None:
    server = start_server(tmp_path / "server", SEAT_ARGS)
    try:
        unenforced = _memory_unenforced(server)
        if unenforced:
            pytest.skip(f"this machine cannot enforce memory limits: {unenforced}")
        stateless = _value(execute(server.url, run_source(OWN_LIMITS)))
        created = request(server.url, "POST", "/v1/sessions", b"{}")
        assert created.status == 201, created.body
        sid = created.body["session_id"]
        from raw_http import execute_body

        content_type, body = execute_body(run_source(OWN_LIMITS))
        answer = request(
            server.url, "POST", f"/v1/sessions/{sid}/execute", body, {"Content-Type": content_type}
        )
        assert answer.status == 200 and answer.body["status"] == "COMPLETED", answer.body
        session = json.loads(answer.body["results"]["value"]["value"])
        assert session == stateless
        # the session seat is one of the seats the parent is shared over, not extra
        assert session["parent_name"].startswith("kcoral-workers-"), session
        assert session["worker"] <= max(session["parent"] // SEATS, 4096 * MIB), session
        assert session["worker"] == _expected().memory_bytes
    finally:
        server.stop()
