"""``notebooks/benchmark_kernel.ipynb`` executed by nbclient on a real kernel against a real
CPU server: the comparison renders its plot (an inline SVG) above the table, the history is
kept under the cell's ``--bench-label``, and a second run shows the change against the first."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from server_process import running_server

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(tmp_path_factory.mktemp("bench-notebook"), ["--num-workers", "1"]) as s:
        yield s.url


def execute(url: str, directory: Path, monkeypatch: pytest.MonkeyPatch) -> nbformat.NotebookNode:
    monkeypatch.setenv("KCORAL_URL", url)
    monkeypatch.delenv("KCORAL_TOKEN", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    notebook = nbformat.read(ROOT / "notebooks" / "benchmark_kernel.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=400, kernel_name="python3", resources={"metadata": {"path": directory}}
    ).execute()
    return notebook


def magic_cell(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    return next(c for c in notebook.cells if c.cell_type == "code" and "compare(" in c.source)


def stream_text(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def test_the_benchmark_notebook_shows_the_comparison_plot_and_keeps_its_history(
    tmp_path, monkeypatch
) -> None:
    server = running_server(tmp_path / "server", ["--num-workers", "1"])
    with server as running:
        first = execute(running.url, tmp_path, monkeypatch)
        cell = magic_cell(first)
        result = next(o for o in cell.outputs if o.output_type == "execute_result")
        page = result["data"]["text/html"]
        found = re.search(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', page)
        assert found, "the comparison rendered no plot"
        svg = base64.b64decode(found.group(1)).decode()
        assert ">torch @<" in svg and ">blocked<" in svg
        assert "kcoral-bench-table" in page and "baseline" in page
        assert "512x512 matmul on cpu" in stream_text(cell)
        note = stream_text(cell)
        assert "benchmark 'matmul-512' recorded in" in note
        assert "the kernel's working directory: no notebook path is known" in note
        history = tmp_path / "kcoral-benchmarks.jsonl"
        entries = [json.loads(line) for line in history.read_text().splitlines()]
        assert len(entries) == 1
        assert entries[0]["key"] == {"label": "matmul-512", "gpu": "cpu", "clock": "cpu"}
        assert set(entries[0]["candidates"]) == {"torch @", "blocked"}
        table = stream_text(next(c for c in first.cells if "format_comparison(" in c.source))
        assert "torch @" in table and "blocked" in table and "GFLOP/s" in table
        assert "No GPU on this server" in table

        second = execute(running.url, tmp_path, monkeypatch)
        again = next(o for o in magic_cell(second).outputs if o.output_type == "execute_result")
        assert "vs previous" in again["data"]["text/html"]
        assert len(history.read_text().splitlines()) == 2
