"""The fleet at a glance (ROUTER §6): ``/v1/info``'s ``fleet_status`` through a real router
with a real CPU node — seats, free seats, the queue while a program holds the only seat and
another waits, and an estimated wait that is ``null`` until the node's supervisor has
reported recent programs (the router never reads answers) and present after."""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import pytest
from kcoral_server.node.status_stream import LEASE_STAT_TIMES, lease_stats_message
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.admission.selection import fleet_status
from kcoral_server.router.nodes.gateway import status_problem
from kcoral_server.router.nodes.registry import Registry
from kcoral_server.router.settings import RouterSettings
from raw_http import call_program, post_execute, request
from router_helpers import Node, start_router, stopping
from test_router_kinds import join, status
from waiting import wait_for

import kcoral

# Holds its seat until the test creates the file it names.
HOLD = (
    "import os, time\n\n"
    "def main(path):\n"
    "    while not os.path.exists(path):\n"
    "        time.sleep(0.02)\n"
    "    return os.getpid()\n"
)


def status_rows(router) -> dict[str, list[dict[str, Any]]] | None:
    info = request(router.url, "GET", "/v1/info")
    return info.body.get("fleet_status") if info.status == 200 else None


def only_kind(router) -> dict[str, Any] | None:
    rows = status_rows(router)
    return rows["kinds"][0] if rows and rows["kinds"] else None


def wait_until_its_seat_is_free(router) -> None:
    """Until the only kind's row has its one seat free: its node ready, nothing held."""
    wait_for(
        lambda: (row := only_kind(router)) and row["free_seats"] == 1,
        "the node ready with its seat free",
        90.0,
        detail=router.log,
    )


class Held:
    """Programs that hold a seat until ``release``; their answers, in order sent."""

    def __init__(self, router, path: Path) -> None:
        self.router, self.path = router, path
        self.answers: list[Any] = []
        self.threads: list[threading.Thread] = []

    def send(self) -> None:
        program = call_program(HOLD, args=[str(self.path)])

        def run() -> None:
            self.answers.append(post_execute(self.router.url, program))

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)

    def release(self) -> None:
        self.path.write_text("go")
        for thread in self.threads:
            thread.join(120)
        assert [a.status for a in self.answers] == [200] * len(self.threads)
        self.path.unlink()
        self.threads.clear()
        self.answers.clear()


@pytest.mark.slow
def test_fleet_status_shows_seats_the_queue_and_an_estimate_once_programs_ran(
    tmp_path: Path,
) -> None:
    router = start_router(tmp_path, "--status-check-interval-seconds", "0.3")
    nodes = [Node(tmp_path, router, "cpu-a", None, "--node-label", "pool=small")]
    with stopping(router, nodes):
        idle = wait_for(
            lambda: (k := only_kind(router)) and k["seats"] == 1 and k,
            "ready",
            90.0,
            detail=router.log,
        )
        # Before any program: one free seat, nothing queued, no estimate (no recent leases).
        assert idle == {
            "gpu": "cpu",
            "arch": None,
            "gpus": 0,
            "default": True,
            "nodes": 1,
            "seats": 1,
            "free_seats": 1,
            "queued": 0,
            "recent_programs": 0,
            "estimated_wait_seconds": None,
        }
        rows = status_rows(router)
        assert rows is not None
        assert rows["labels"] == [
            {"key": "pool", "value": "small"} | {k: idle[k] for k in list(idle)[4:]}
        ]

        # One program holds the only seat, a second waits at the router.
        held = Held(router, tmp_path / "release")
        held.send()
        wait_for(
            lambda: only_kind(router)["free_seats"] == 0, "the seat taken", 90.0, detail=router.log
        )
        held.send()
        busy = wait_for(
            lambda: (k := only_kind(router))["queued"] == 1 and k,
            "the second queued",
            90.0,
            detail=router.log,
        )
        assert busy["seats"] == 1 and busy["free_seats"] == 0
        assert busy["recent_programs"] == 0 and busy["estimated_wait_seconds"] is None
        # The router's metrics count the same waiter for the kind it waits for.
        scraped = request(router.url, "GET", "/metrics").raw.decode()
        assert 'kcoral_router_kind_queue_depth{kind="cpu"} 1.0' in scraped.splitlines()
        held.release()

        # The supervisor reports both programs; with the seat free the wait is 0.
        after = wait_for(
            lambda: (k := only_kind(router))["recent_programs"] == 2 and k,
            "two reported",
            90.0,
            detail=router.log,
        )
        assert after["free_seats"] == 1 and after["queued"] == 0
        assert after["estimated_wait_seconds"] == 0.0

        # Busy again, with one waiting: the estimate is two recent seat holds' worth.
        held.send()
        held.send()
        waiting = wait_for(
            lambda: (k := only_kind(router))["queued"] == 1 and k,
            "queued again",
            90.0,
            detail=router.log,
        )
        assert waiting["free_seats"] == 0
        assert isinstance(waiting["estimated_wait_seconds"], float)
        assert waiting["estimated_wait_seconds"] > 0
        held.release()


@pytest.mark.slow
def test_a_seat_running_a_job_is_not_counted_as_free(tmp_path: Path) -> None:
    # A job gives back its worker slot with its 202 and runs on its seat until it ends:
    # before, fleet_status counted the idle slot, and a node busy with jobs read as free.
    router = start_router(tmp_path, "--status-check-interval-seconds", "0.3")
    nodes = [Node(tmp_path, router, "cpu-a")]
    with stopping(router, nodes):
        wait_until_its_seat_is_free(router)
        release = tmp_path / "release"
        client = kcoral.Client(router.url)
        program = kcoral.Program()
        module = program.upload(kind="module", source=HOLD)
        held = program.run(fn=program.get_function(module=module, name="main"), args=[str(release)])
        program.return_(key="pid", value=held)
        jobs = [client.submit(program, timeout_seconds=120) for _ in range(2)]
        # The node's own pool holds the second job: the status that says so also says the
        # first one's seat is busy.
        row = wait_for(
            lambda: (k := only_kind(router))["queued"] == 1 and k,
            "the second waits",
            90.0,
            detail=router.log,
        )
        assert (row["seats"], row["free_seats"]) == (1, 0)
        release.write_text("go")
        assert [job.result(timeout=120).status for job in jobs] == ["COMPLETED"] * 2
        client.close()


# -- the numbers, on the router's registry (decision logic; the real run is above) ---------


def test_fleet_status_counts_each_rows_seats_queue_and_estimate() -> None:
    registry = Registry(RouterSettings())
    join(registry, "c1", "cpu", pool="small")
    join(registry, "h1", "h100", pool="big")
    join(registry, "h2", "h100", pool="big")
    registry.nodes["h1"].lease_stats = pb.LeaseStats(count=3, seat_held_mean_ms=4000.0)
    registry.nodes["h2"].lease_stats = pb.LeaseStats(count=1, seat_held_mean_ms=8000.0, queued=2)
    taken = registry.select("c1", "r1")  # c1's only seat is busy
    assert taken is not None
    # Two requests wait at the router for the default kind (cpu), one for gpu=h100.
    rows = fleet_status(registry, [({}, None), ({}, None), ({"gpu": "h100"}, None)])
    cpu, h100 = rows["kinds"]
    assert cpu == {
        "gpu": "cpu",
        "arch": None,
        "gpus": 1,
        "default": True,
        "nodes": 1,
        "seats": 1,
        "free_seats": 0,
        "queued": 2,
        "recent_programs": 0,
        "estimated_wait_seconds": None,  # no recent programs: no estimate
    }
    # h100: 2 seats, both free, 1 waiting at the router + 2 in h2's own pool; the mean seat
    # hold of the 4 recent programs is 5 s: (3 + 1 - 2) / 2 * 5 s.
    assert h100["seats"] == 2 and h100["free_seats"] == 2 and h100["queued"] == 3
    assert h100["recent_programs"] == 4 and h100["estimated_wait_seconds"] == 5.0
    big, small = rows["labels"]
    assert (big["key"], big["value"], big["queued"], big["estimated_wait_seconds"]) == (
        "pool",
        "big",
        3,
        5.0,
    )
    assert (small["value"], small["queued"], small["free_seats"]) == ("small", 2, 0)
    # A waiter whose program asks for two GPUs counts only where a node has two.
    registry.nodes["h2"].gpus = 2
    rows = fleet_status(registry, [({"gpu": "h100"}, 2)])
    # (h1 has one GPU; h2 has two, and two waiting in its own pool)
    assert [(row["gpus"], row["queued"]) for row in rows["kinds"]] == [(1, 0), (1, 0), (2, 3)]


def test_a_status_with_non_finite_or_unbounded_lease_stats_is_invalid() -> None:
    settings = RouterSettings()
    good = status("n", "h100", {})
    good.lease_stats.CopyFrom(pb.LeaseStats(count=2, seat_held_mean_ms=10.0, queued=1))
    assert status_problem(good, settings, None) is None
    for field, value in (
        ("seat_held_mean_ms", math.nan),
        ("seat_held_p50_ms", math.inf),
        ("lease_held_mean_ms", -1.0),
        ("lease_held_p50_ms", 1e300),
        ("count", 2**31),
        ("queued", 2**40),
    ):
        bad = status("n", "h100", {})
        bad.lease_stats.CopyFrom(pb.LeaseStats(**{field: value}))
        assert "lease_stats" in (status_problem(bad, settings, None) or ""), field


def test_the_supervisor_reports_the_childs_lease_stats_and_drops_malformed_ones() -> None:
    body = {
        "lease_stats": {
            "count": 2,
            "seat_held_mean_ms": 12.5,
            "seat_held_p50_ms": 12.5,
            "lease_held_mean_ms": 0.0,
            "lease_held_p50_ms": 0.0,
            "queued": 1,
        }
    }
    message = lease_stats_message(body)
    assert message == pb.LeaseStats(
        count=2, seat_held_mean_ms=12.5, seat_held_p50_ms=12.5, queued=1
    )
    # The proto round trip keeps every field (what the router reads is what was sent).
    assert pb.LeaseStats.FromString(message.SerializeToString()) == message
    none_yet = {"lease_stats": {"count": 0, "queued": 0} | dict.fromkeys(LEASE_STAT_TIMES)}
    assert lease_stats_message(none_yet) == pb.LeaseStats()
    assert lease_stats_message({}) is None  # a child of another version
    for broken in (
        {"count": -1},
        {"count": "2"},
        {"seat_held_mean_ms": "x"},
        {"queued": True},
        {"queued": 2**64},
    ):
        assert lease_stats_message({"lease_stats": body["lease_stats"] | broken}) is None
