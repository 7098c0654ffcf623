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


class Unequal:
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no comparing me")


class Plain:
    """Equal only to itself, as every object without its own ``__eq__``."""


def test_results_that_cannot_be_compared_end_nothing_and_warn_of_nothing() -> None:
    # a dataclass of tensors raises in ==, a plain object is equal only to itself: neither
    # shows a difference, so neither is a warning
    for made in (Unequal, Plain):
        result = compare({"base": made, "other": made}, FEW_ROUNDS)
        assert [entry["status"] for entry in result["candidates"].values()] == ["ok", "ok"]
        assert not [w for w in result["warnings"] if "the baseline's" in w], result["warnings"]


def test_a_tensor_in_a_message_reads_on_one_line() -> None:
    # a tensor's repr breaks its rows over lines: the table's line read
    # "None differs from the reference tensor([[1., 1., 1.],?        [1., 1., 1.],..."
    import torch

    def ones() -> torch.Tensor:
        return torch.ones(3, 3)

    def nothing() -> None:
        return None

    unlike = compare({"base": ones, "other": nothing}, FEW_ROUNDS)["warnings"][-1]
    assert unlike.startswith("'other': None differs from the baseline's tensor([[1., 1., 1.], [1.")
    checked = compare(
        {"base": ones, "other": nothing}, FEW_ROUNDS | {"reference": torch.ones(3, 3)}
    )
    error = checked["candidates"]["other"]["error"]
    assert error.startswith("None differs from the reference tensor([[1., 1., 1.], [1."), error
