"""A long list of JSON scalars is checked and copied in one pass, with the same refusals.

A JSON-mode call with a list of a million floats spent about 0.5 s (1.6 s under a profiler)
in the client's check of each item, then as long again in ``Program.run``'s copy of each,
before anything was sent; a NumPy array of the same numbers took milliseconds.
"""

from __future__ import annotations

import enum

import pytest

import kcoral.program
import kcoral.remote
import kcoral.remote.arguments
from kcoral.remote import RemoteFunction


def total(xs):
    return sum(xs)


class Level(enum.IntEnum):
    LOW = 1


def counting(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[int]:
    calls = [0]
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_a_long_list_of_scalars_is_checked_and_copied_in_one_pass(monkeypatch) -> None:
    calls = counting(monkeypatch, kcoral.remote, "check_json")  # one per argument
    items = counting(monkeypatch, kcoral.remote.arguments, "check_json")  # inside one
    copies = counting(monkeypatch, kcoral.program, "copy_literal")
    values = [1.5, 2, None, True, "ab", "é"] * 2000
    program = RemoteFunction(total, client=None).build_program(values)
    assert calls[0] + items[0] + copies[0] < 10  # was one of each per item: 24,000
    literal = next(i for i in program.instructions if i["op"] == "run")["args"][3]
    assert literal == {"value": values} and literal["value"] is not values  # still a copy


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        (float("nan"), ValueError, r"^argument 'xs'\[3\] is a non-finite float \(nan\)"),
        ("\udc80", ValueError, r"^argument 'xs'\[3\] holds a lone surrogate at position 0"),
        (Level.LOW, TypeError, r"^argument 'xs'\[3\] is of type Level, not a JSON value"),
        ([float("inf")], ValueError, r"^argument 'xs'\[3\]\[0\] is a non-finite float"),
    ],
)
def test_a_long_list_still_names_the_one_item_json_cannot_carry(bad, error, message) -> None:
    values = [0.5, 1.0, 2.0, bad] + [3.0] * 1000
    with pytest.raises(error, match=message):
        RemoteFunction(total, client=None).build_program(values)
