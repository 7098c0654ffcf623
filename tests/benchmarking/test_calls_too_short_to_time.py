"""A call too short for the clock says so (EXTENSIONS §12.4): on a CPU worker its median is
compared with what the clock measures for an empty call."""

from __future__ import annotations

from kcoral.bench.clock_floor import FLOOR_FACTOR, floor_warning
from kcoral.builtins import benchmark


def spin() -> None:
    sum(range(200_000))  # milliseconds: thousands of empty calls' worth


def test_an_empty_call_is_said_to_be_mostly_the_measurements_own_cost() -> None:
    # it read "0.000786 ms" with 280 % noise, and nothing said that was the timer
    result = benchmark(lambda: None, {"warmup": 1, "repeat": 50})
    too_short = [w for w in result["warnings"] if "empty call" in w]
    assert len(too_short) == 1
    assert too_short[0].startswith("the call: its median, ")
    assert " µs, is under 10× an empty call's (" in too_short[0]


def test_a_call_of_milliseconds_has_no_such_warning() -> None:
    result = benchmark(spin, {"warmup": 1, "repeat": 10})
    assert not [w for w in result["warnings"] if "empty call" in w]


def test_the_floor_rule_in_numbers() -> None:
    assert floor_warning("x", FLOOR_FACTOR * 0.001, 0.001) is None
    text = floor_warning("x", 0.000786, 0.0009)
    assert text == (
        "x: its median, 0.786 µs, is under 10× an empty call's (0.9 µs): mostly the "
        "measurement; time a loop of calls"
    )
    assert floor_warning("x", 0.5, None) is None  # GPU clocks: no floor
