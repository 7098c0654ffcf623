"""``compare`` without a ``reference`` checks nothing, but a candidate whose result is unlike
the baseline's is said in the warnings (EXTENSIONS §12.3): a candidate that computed
something else read as plainly '2× faster'."""

from __future__ import annotations

from kcoral.builtins import compare

FEW_ROUNDS = {"repeat": 6, "warmup": 1, "seed": 0}


def one() -> int:
    return 1


def two() -> int:
    return 2


def test_a_candidate_returning_another_result_is_warned_of_and_still_timed() -> None:
    result = compare({"base": one, "other": two, "same": one}, FEW_ROUNDS)
    assert result["reference_checked"] is False
    unlike = [w for w in result["warnings"] if "the baseline's" in w]
    assert unlike == [
        "'other': 2 differs from the baseline's 1; with no 'reference' nothing was checked, "
        "so its speedup may time different work"
    ], result["warnings"]
    assert {name: entry["status"] for name, entry in result["candidates"].items()} == {
        "base": "ok",
        "other": "ok",
        "same": "ok",
    }


def test_with_a_reference_the_mismatch_is_the_candidates_status_not_a_warning() -> None:
    result = compare({"base": one, "other": two}, FEW_ROUNDS | {"reference": 1})
    assert result["candidates"]["other"]["status"] == "mismatch"
    assert not [w for w in result["warnings"] if "the baseline's" in w], result["warnings"]


def test_results_that_cannot_be_compared_end_nothing() -> None:
    class Unequal:
        def __eq__(self, other: object) -> bool:
            raise RuntimeError("no comparing me")

    result = compare({"base": Unequal, "other": Unequal}, FEW_ROUNDS)
    assert [entry["status"] for entry in result["candidates"].values()] == ["ok", "ok"]
    assert any("cannot compare with the baseline's" in w for w in result["warnings"])
