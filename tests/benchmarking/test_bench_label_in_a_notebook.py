"""``%%kcoral --bench-label`` run by nbclient on a real kernel against a real CPU server with
a client token (EXTENSIONS §12.6): one label cannot hold two kernels of one cell, or the
second reads as a change of the first; a label with nothing to record says so; a --noblock
cell's label is kept until ``%kcoral attach`` brings its result."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from server_process import RunningServer, client_token_file, running_server

from kcoral.bench.history import HISTORY_FILE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
TOKEN = "one-label-several-results-token"

TWO_KERNELS = """%%kcoral -o fast -o slow --bench-label pair
from kcoral.builtins import benchmark
config = {"repeat": 10, "warmup": 1, "flush_l2": False}
fast = benchmark(lambda: None, config)
slow = benchmark(lambda: sum(range(20000)), config)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("one-label")
    tokens = client_token_file(directory, TOKEN + "\n")
    with running_server(directory, ["--num-workers", "1", "--auth-token-file", str(tokens)]) as s:
        yield s


def shown(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def run_notebook(server: RunningServer, cells: list[str], directory: Path, monkeypatch) -> list:
    monkeypatch.setenv("KCORAL_URL", server.url)
    monkeypatch.setenv("KCORAL_TOKEN", TOKEN)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": directory}}
    ).execute()
    return notebook.cells


def test_two_different_results_under_one_bench_label_are_not_compared_with_each_other(
    server, tmp_path, monkeypatch
) -> None:
    cells = run_notebook(
        server,
        ["%load_ext kcoral", TWO_KERNELS, "print('history' in fast, 'history' in slow)"],
        tmp_path,
        monkeypatch,
    )
    out = shown(cells[1])
    assert (
        "kcoral: benchmark 'pair' not recorded: the cell gave 2 different results under this "
        "one label, which would be compared with each other" in out
    )
    assert "recorded in" not in out
    assert not (tmp_path / HISTORY_FILE).exists()
    assert shown(cells[2]).strip() == "False False"  # no change of 'slow' against 'fast'


def test_a_bench_label_on_a_cell_without_a_benchmark_result_says_nothing_was_recorded(
    server, tmp_path, monkeypatch
) -> None:
    median_only = (
        "%%kcoral --bench-label scalar\n"
        "from kcoral.builtins import benchmark\n"
        'benchmark(lambda: None, {"repeat": 10, "warmup": 1})["latency_ms_median"]\n'
    )
    cells = run_notebook(server, ["%load_ext kcoral", median_only], tmp_path, monkeypatch)
    assert (
        "kcoral: benchmark 'scalar' not recorded: neither the cell's value nor an -o name holds "
        "a benchmark or comparison result" in shown(cells[1])
    )
    assert not (tmp_path / HISTORY_FILE).exists()


def test_a_noblock_cells_bench_label_is_recorded_when_its_job_is_attached(
    server, tmp_path, monkeypatch
) -> None:
    submitted = (
        "%%kcoral --noblock -r job --bench-label later\n"
        "from kcoral.builtins import benchmark\n"
        'benchmark(lambda: None, {"repeat": 10, "warmup": 1})\n'
    )
    cells = run_notebook(
        server, ["%load_ext kcoral", submitted, "%kcoral attach {job.id}"], tmp_path, monkeypatch
    )
    assert f"kcoral: benchmark 'later' recorded in {tmp_path / HISTORY_FILE}" in shown(cells[2])
    assert len((tmp_path / HISTORY_FILE).read_text().splitlines()) == 1


def test_a_link_a_neighbour_put_in_the_historys_place_is_not_followed_by_the_magic(
    server, tmp_path, monkeypatch
) -> None:
    # a shared notebook folder: another user links the history to the notebook user's file
    victim = tmp_path / "dotfile"
    victim.write_text("export PATH=/usr/bin\n")
    (tmp_path / HISTORY_FILE).symlink_to(victim)
    labelled = (
        "%%kcoral --bench-label linked\n"
        "from kcoral.builtins import benchmark\n"
        'benchmark(lambda: None, {"repeat": 10, "warmup": 1})\n'
    )
    cells = run_notebook(
        server, ["%load_ext kcoral", labelled, "print(_['sample_count'])"], tmp_path, monkeypatch
    )
    assert (
        f"kcoral: benchmark 'linked' not recorded in {tmp_path / HISTORY_FILE}: OSError: it is "
        "a symbolic link, not a plain file of yours" in shown(cells[1])
    )
    assert shown(cells[2]).strip() == "10"  # the cell's result is kept all the same
    assert victim.read_text() == "export PATH=/usr/bin\n"
