"""A baseline that raises in its warm-up or a round of ``compare`` fails alone (EXTENSIONS
§12.2): the others' statistics stand, without speedups, and a warning says why. Before,
the whole comparison raised, and every other candidate's measurement was thrown away."""

from __future__ import annotations

from collections.abc import Callable

from kcoral.builtins import compare

ROUNDS = {"repeat": 20, "warmup": 2, "seed": 0}


def failing_at(call: int) -> Callable[[], None]:
    """A function whose ``call``-th call raises (the correctness check is call 1)."""
    made = [0]

    def flaky() -> None:
        made[0] += 1
        if made[0] == call:
            raise RuntimeError("flaky")

    return flaky


def steady() -> None:
    return None


def test_a_baseline_failing_in_a_round_leaves_the_others_measured() -> None:
    result = compare({"base": failing_at(12), "a": steady, "b": steady}, ROUNDS)
    base, a, b = (result["candidates"][name] for name in ("base", "a", "b"))
    assert base["status"] == "failed"
    assert (
        base["error"]
        == "RuntimeError: flaky (in call 12, the correctness check and warm-up included)"
    )
    for entry in (a, b):
        assert entry["status"] == "ok" and entry["sample_count"] == 20
        assert entry["speedup"] is None
    assert (
        "no speedups: the baseline 'base' failed while timed; the other candidates' statistics "
        "stand"
    ) in result["warnings"]


def test_a_baseline_failing_in_its_warm_up_leaves_the_others_measured() -> None:
    result = compare({"base": failing_at(2), "a": steady}, ROUNDS)
    assert result["candidates"]["base"]["status"] == "failed"
    assert result["candidates"]["a"]["sample_count"] == 20


def test_when_every_candidate_fails_each_says_why() -> None:
    result = compare({"base": failing_at(2), "a": failing_at(3)}, ROUNDS)
    assert [entry["status"] for entry in result["candidates"].values()] == ["failed", "failed"]
    assert "in call 3" in result["candidates"]["a"]["error"]
