"""``%%kcoral --bench-label`` on a real CPU server, in the process's IPython shell: a history
file that cannot be read or written costs the record, never the cell's result
(EXTENSIONS §12.6)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kcoral_shell import kcoral_shell
from server_process import running_server

from kcoral.bench.history import HISTORY_FILE
from kcoral.bench.results import BenchmarkResult

CELL = """%%kcoral --bench-label mm
from kcoral.builtins import benchmark
benchmark(lambda: None, {"warmup": 1, "repeat": 10, "flush_l2": False})
"""


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(tmp_path_factory.mktemp("magic-history"), ["--num-workers", "1"]) as s:
        yield s.url


def test_a_history_that_cannot_be_written_keeps_the_cells_result_and_says_so(
    server_url, tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / HISTORY_FILE).mkdir()  # a folder in the file's place: no write succeeds
    with kcoral_shell(server_url, monkeypatch, ()) as ip:
        cell = ip.run_cell(CELL)
    assert cell.error_in_exec is None
    assert isinstance(cell.result, BenchmarkResult) and cell.result["sample_count"] == 10
    assert "history" not in cell.result
    out = capsys.readouterr().out
    assert f"kcoral: benchmark 'mm' not recorded in {tmp_path.resolve() / HISTORY_FILE}" in out
