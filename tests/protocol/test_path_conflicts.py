"""``conflicting_paths`` and ``UploadedPaths``: which upload paths clash (PROTOCOL §5.5), and
at what cost."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from typing import Any

from kcoral import Program
from kcoral.protocol.paths import UploadedPaths, conflicting_paths


def _reference(paths: list[str]) -> tuple[str, str] | None:
    """The rule as written: the first duplicate, else the first path (in order) below
    another one, with the shortest such one."""
    seen = set()
    for path in paths:
        if path in seen:
            return path, path
        seen.add(path)
    for path in paths:
        parts = path.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in seen:
                return "/".join(parts[:i]), path
    return None


def _builtin_calls(function: Callable[[], Any]) -> int:
    """How many built-in functions and methods ``function`` calls (a count, not a time)."""
    calls = 0

    def profile(_frame: Any, event: str, _arg: Any) -> None:
        nonlocal calls
        if event == "c_call":
            calls += 1

    sys.setprofile(profile)
    try:
        function()
    finally:
        sys.setprofile(None)
    return calls


def test_conflicts_are_found_as_the_rule_says_with_names_that_sort_around_the_slash() -> None:
    names = ["a", "b", "a.b", "a-", "ab", "b0"]  # '-' and '.' sort before '/', '0' after
    chosen = random.Random(7)
    for _ in range(20000):
        paths = [
            "/".join(chosen.choice(names) for _ in range(chosen.randint(1, 4)))
            for _ in range(chosen.randint(0, 6))
        ]
        assert conflicting_paths(paths) == _reference(paths), paths


def test_the_paths_of_a_deep_folder_are_checked_in_work_linear_in_their_number() -> None:
    # Joining every prefix of every path made 4000 files of a 2000-level folder take 40 s
    # (Program.upload_folder, kcoral run --send, the worker's parse): ~300 calls a path
    # here, growing with the depth. A file and a subdirectory at each of 300 levels:
    paths = [f"{'a/' * level}{leaf}" for level in range(300) for leaf in ("f", "b/f")]
    assert conflicting_paths(paths) is None
    assert _builtin_calls(lambda: conflicting_paths(paths)) <= 10 * len(paths)
    clash = [*paths, "a/a/a/f/g"]
    assert conflicting_paths(clash) == ("a/a/a/f", "a/a/a/f/g")


def test_uploaded_paths_find_a_conflict_exactly_where_the_rule_finds_one() -> None:
    names = ["a", "b", "a.b", "a-", "ab", "b0"]
    chosen = random.Random(11)
    for _ in range(20000):
        paths = [
            "/".join(chosen.choice(names) for _ in range(chosen.randint(1, 4)))
            for _ in range(chosen.randint(0, 6))
        ]
        cut = chosen.randint(0, len(paths))
        if _reference(paths[:cut]) is not None:
            continue
        uploaded = UploadedPaths()
        uploaded.add(paths[:cut])
        found = uploaded.conflict(paths[cut:])
        assert (found is None) == (_reference(paths) is None), paths
        if found is not None:  # a true clash: the same path, or a file above the other
            above, below = found
            assert above in paths and below in paths
            assert above == below or below.startswith(above + "/"), (paths, found)
        assert uploaded.conflict(paths[cut:]) == found  # a check adds nothing


def test_a_program_of_many_single_file_uploads_checks_each_against_the_others_once() -> None:
    # conflicting_paths over every earlier path at each upload_file: 20,000 of them took
    # almost 4 minutes to add, 8,000 took 16 s (about n**2 / 2 calls here)
    def add(count: int) -> None:
        program = Program()
        for index in range(count):
            program.upload_file(blob=b"%d" % index, path=f"d{index % 50}/e/f{index}")

    assert _builtin_calls(lambda: add(2000)) <= 2 * _builtin_calls(lambda: add(1000)) + 100
