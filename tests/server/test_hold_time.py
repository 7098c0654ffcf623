"""The time each identity held each GPU lately (``gpu.hold_time``), which GPU lease turns go
by (SERVER §5): it fades by half each half-life, and a record faded to nothing is dropped,
so the table stays as small as the set of identities that held a GPU lately."""

from __future__ import annotations

from kcoral_server.gpu.hold_time import HALF_LIFE_SECONDS, RecentHoldTime


def test_a_hold_counts_half_after_one_half_life_and_a_quarter_after_two() -> None:
    held = RecentHoldTime()
    held.charge("alice", 0, 8.0, now=100.0)
    assert held.of("alice", [0], now=100.0) == 8.0
    assert held.of("alice", [0], now=100.0 + HALF_LIFE_SECONDS) == 4.0
    assert held.of("alice", [0], now=100.0 + 2 * HALF_LIFE_SECONDS) == 2.0


def test_a_new_hold_adds_to_what_is_left_of_the_earlier_ones() -> None:
    held = RecentHoldTime()
    held.charge("alice", 0, 8.0, now=0.0)
    held.charge("alice", 0, 1.0, now=HALF_LIFE_SECONDS)
    assert held.of("alice", [0], now=HALF_LIFE_SECONDS) == 5.0


def test_an_identity_counts_the_most_it_held_of_the_gpus_asked_for_and_nothing_of_others() -> None:
    held = RecentHoldTime()
    held.charge("alice", 0, 3.0, now=0.0)
    held.charge("alice", 1, 5.0, now=0.0)
    held.charge("bob", 2, 9.0, now=0.0)
    assert held.of("alice", [0, 1, 2], now=0.0) == 5.0
    assert held.of("alice", [2], now=0.0) == 0.0
    assert held.of("carol", [0, 1, 2], now=0.0) == 0.0
    assert held.of(None, [0], now=0.0) == 0.0  # a worker's start-ups are one more identity


def test_holds_faded_to_nothing_are_forgotten_so_many_past_identities_take_no_memory() -> None:
    held = RecentHoldTime()
    for number in range(1000):
        held.charge(f"user-{number}", number % 8, 3600.0, now=0.0)
    assert len(held) == 1000
    a_day = 24 * 3600.0
    held.charge("alice", 0, 1.0, now=a_day)
    assert len(held) == 1
    assert held.of("user-0", [0], now=a_day) == 0.0
