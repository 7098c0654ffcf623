"""Which finished jobs the byte bound drops, and what their owners and the log are told.

``JobRegistry.sweep`` on jobs made by hand (no server): the bound, ``--job-retention-bytes``,
is shared by every identity, so over it the owner holding the most bytes loses its oldest
job first; one owner alone sees plain oldest-first. A real server under the same attack:
tests/security/test_job_retention_flood.py.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any, cast

from kcoral_server.front_door.callers import Identity
from kcoral_server.jobs.store import (
    EVENT_OVERHEAD_BYTES,
    RECORD_OVERHEAD_BYTES,
    Expiry,
    Job,
    JobRegistry,
    StoredResult,
)

KIB = 1024


def _finished(registry: JobRegistry, owner: str, body_bytes: int, at: float) -> Job:
    job = Job(f"request-{owner}-{at}", {}, owner)
    job.status = "COMPLETED"
    job.result = StoredResult(200, {}, b"r" * body_bytes)
    job.finished_monotonic = at
    registry.add(job)
    return job


def _sweep(bound: int, jobs: list[tuple[str, int]]) -> tuple[list[str], list[dict[str, Any]]]:
    """Owners of the jobs kept (in order) after one sweep, and the events it emitted."""
    events: list[dict[str, Any]] = []

    def emit(event: str, level: str = "INFO", **fields: Any) -> None:
        events.append({"event": event, "level": level, **fields})

    async def run() -> list[str]:
        registry = JobRegistry(3600, bound, emit=emit)
        now = time.monotonic()
        made = [
            _finished(registry, owner, size, now - 100 + i) for i, (owner, size) in enumerate(jobs)
        ]
        registry.sweep()
        return [job.owner + str(made.index(job)) for job in registry.jobs.values()]

    return asyncio.run(run()), events


def test_one_owner_over_the_bound_loses_its_oldest_jobs_first() -> None:
    kept, events = _sweep(3 * (10 * KIB + RECORD_OVERHEAD_BYTES), [("a", 10 * KIB)] * 5)
    assert kept == ["a2", "a3", "a4"]
    assert [e["reason"] for e in events] == ["space", "space"]


def test_a_flooding_owner_loses_its_own_jobs_before_an_older_small_job_of_another() -> None:
    # alice's small job is the oldest; bob's ten large ones push the total past the bound.
    jobs = [("alice", 2 * KIB)] + [("bob", 100 * KIB)] * 10
    kept, events = _sweep(500 * KIB, jobs)
    assert kept[0] == "alice0"
    assert all(owner.startswith("bob") for owner in kept[1:])
    assert {e["owner"] for e in events} == {"bob"}
    assert [e["level"] for e in events] == ["WARNING"] * len(events)


def test_over_the_bound_the_largest_holder_gives_up_bytes_until_the_rest_fit() -> None:
    jobs = [("alice", 40 * KIB), ("bob", 40 * KIB), ("alice", 40 * KIB), ("bob", 10 * KIB)]
    kept, _ = _sweep(100 * KIB, jobs)
    # alice holds 80 KiB against bob's 50: her oldest goes; then 90 KiB + overheads fit.
    assert kept == ["bob1", "alice2", "bob3"]


def test_a_job_larger_than_the_bound_goes_alone_and_says_so() -> None:
    kept, events = _sweep(50 * KIB, [("alice", KIB), ("alice", 60 * KIB), ("alice", KIB)])
    assert kept == ["alice0", "alice2"]
    assert [(e["event"], e["reason"]) for e in events] == [("job_expired", "too_large")]
    assert events[0]["bytes"] > 60 * KIB and events[0]["retention_bytes"] == 50 * KIB


def test_an_expired_job_tells_its_owner_why_and_others_nothing() -> None:
    async def run() -> tuple[object, object, object]:
        registry = JobRegistry(0.0, 1 << 30)
        job = _finished(registry, "alice", KIB, time.monotonic() - 1)
        registry.sweep()
        return (
            registry.lookup(job.id, Identity("alice")),
            registry.lookup(job.id, Identity("bob")),
            registry.lookup("no-such-job", Identity("alice")),
        )

    own, other, unknown = asyncio.run(run())
    assert isinstance(own, Expiry) and own.reason == "age"
    assert own.message == "job expired: its --job-retention-seconds passed"
    assert other is None and unknown is None


def test_a_finished_job_lets_go_of_its_request_and_counts_what_its_events_cost() -> None:
    # A retained trivial job held the request that ran it (program, record, pipeline): the
    # server's memory per job was 6.5 KiB where retention counted 2 KiB (jobs soak); with
    # the request let go it is 4.4 KiB, which the count now matches.
    async def run() -> Job:
        job = Job("request-1", {}, "alice")
        record = SimpleNamespace(status="COMPLETED", seat=None, times=None, error=None)
        request = SimpleNamespace(record=record, finish_reason="completed")
        job.accepted(cast(Any, request))
        assert job.request is request
        job.finish(
            cast(Any, request), cast(Any, SimpleNamespace(status=200)), StoredResult(200, {}, b"{}")
        )
        return job

    job = asyncio.run(run())
    assert job.status == "COMPLETED" and job.request is None
    events = job.event_bytes + EVENT_OVERHEAD_BYTES * job.event_count
    assert job.event_count == 2 and job.size == RECORD_OVERHEAD_BYTES + 2 + events
