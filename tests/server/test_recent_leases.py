"""``RecentLeases`` (PROTOCOL §13): the last programs that ran on a seat, within a window, as
a node's child reports them to its supervisor."""

from __future__ import annotations

from kcoral_server.front_door.recent_leases import RecentLeases


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def finished(elapsed: float, held: float | None = None, **more: object) -> dict[str, object]:
    fields: dict[str, object] = {"worker_id": "cpu-0", "elapsed_ms": elapsed, **more}
    if held is not None:
        fields["lease_held_ms"] = held
    return fields


def test_no_recent_programs_means_null_times() -> None:
    assert RecentLeases().summary() == {
        "count": 0,
        "seat_held_mean_ms": None,
        "seat_held_p50_ms": None,
        "lease_held_mean_ms": None,
        "lease_held_p50_ms": None,
    }


def test_programs_on_a_seat_are_kept_and_summarised() -> None:
    recent = RecentLeases()
    for elapsed, held in ((100.0, 40.0), (200.0, 50.0), (600.0, 300.0)):
        recent.record("request_finished", finished(elapsed, held))
    recent.record("request_finished", finished(50.0))  # a CPU seat: no lease held
    assert recent.summary() == {
        "count": 4,
        "seat_held_mean_ms": 237.5,
        "seat_held_p50_ms": 150.0,
        "lease_held_mean_ms": 97.5,
        "lease_held_p50_ms": 45.0,
    }


def test_refusals_other_events_and_runs_without_a_seat_are_left_out() -> None:
    recent = RecentLeases()
    recent.record("request_finished", {"http_status": 400, "error_kind": "validation"})
    recent.record("request_finished", {"gpu_ids": [0, 1], "elapsed_ms": 5.0})  # a GPU set
    recent.record("request_accepted", finished(5.0))
    recent.record("request_finished", finished(True))  # not a number
    assert recent.summary()["count"] == 0


def test_only_the_last_programs_within_the_window_count() -> None:
    clock = Clock()
    recent = RecentLeases(capacity=3, window=60.0, clock=clock)
    for elapsed in (1.0, 2.0, 3.0, 4.0):
        recent.record("request_finished", finished(elapsed))
    assert recent.summary()["count"] == 3 and recent.summary()["seat_held_mean_ms"] == 3.0
    clock.now += 61.0
    recent.record("request_finished", finished(10.0))
    assert recent.summary()["count"] == 1 and recent.summary()["seat_held_p50_ms"] == 10.0
    clock.now += 61.0
    assert recent.summary()["count"] == 0
