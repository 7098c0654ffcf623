"""``%%kcoral --bench-label NAME`` keeps to the limits of config ``label`` (EXTENSIONS
§12.6): 1 to 200 characters, else the output says why nothing was recorded."""

from __future__ import annotations

import pytest
from test_bench_history import comparison

from kcoral.bench.history import HISTORY_FILE, remember_benchmarks


@pytest.mark.parametrize(("label", "length"), [("x" * 10_000, 10_000), ("", 0)])
def test_a_bench_label_out_of_bounds_records_nothing_and_says_why(
    label, length, tmp_path, monkeypatch
) -> None:
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    notes = remember_benchmarks(label, [comparison(1.0, 2.0, 1)], {})
    assert len(notes) == 1 and len(notes[0]) < 300
    assert notes[0].endswith(
        f"not recorded: --bench-label must be 1 to 200 characters, as config 'label' "
        f"(this one has {length})"
    )
    assert not (tmp_path / HISTORY_FILE).exists()


def test_a_bench_label_with_odd_characters_is_only_a_key(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    notes = remember_benchmarks("../x", [comparison(1.0, 2.0, 1)], {})
    assert notes == [
        f"kcoral: benchmark '../x' recorded in {tmp_path.resolve() / HISTORY_FILE} "
        "(in the kernel's working directory: no notebook path is known)"
    ]
    assert [p.name for p in tmp_path.parent.iterdir() if p.name == "x"] == []


def test_a_rogue_servers_long_label_or_cpu_name_does_not_fill_the_history(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    result = comparison(1.0, 2.0, 1)
    result["label"] = "L" * 100_000  # its own label: a server checks config 'label'
    notes = remember_benchmarks(None, [result], {})
    assert len(notes) == 1 and notes[0].endswith(
        "not recorded: the result's label has 100000 characters, more than 200"
    )
    assert not (tmp_path / HISTORY_FILE).exists()
    named = comparison(1.0, 2.0, 2)
    named["machine"] = {"cpu_model": "C" * 100_000}
    remember_benchmarks("mm", [named], {})
    assert (tmp_path / HISTORY_FILE).stat().st_size < 20_000
