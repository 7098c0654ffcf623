"""What an executed notebook cell (nbclient) shows, for the real-kernel tests of
tests/jupyter."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient
from server_process import running_server


def shown(cell: Any, *, tracebacks: bool = True) -> str:
    """The cell's streams and plain-text results, one output a line, and its error
    tracebacks unless ``tracebacks`` is False."""
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif "data" in output:
            parts.append(output["data"].get("text/plain", ""))
        elif tracebacks and output.output_type == "error":
            parts.append("\n".join(output["traceback"]))
    return "\n".join(parts)


def executed(sources: list[str], directory: Path, *, timeout: int = 120) -> Any:
    """A new notebook of ``sources`` after a real kernel (nbclient) ran it in ``directory``,
    each error kept as its cell's output."""
    return executed_with_lines(sources, directory, timeout=timeout)[0]


class _WatchingClient(NotebookClient):
    """An nbclient that keeps every text a cell's displays said, updates in place included
    (the notebook keeps only the last)."""

    def process_message(self, msg: dict[str, Any], cell: Any, cell_index: int) -> Any:
        if msg["msg_type"] in ("display_data", "update_display_data"):
            plain = msg["content"].get("data", {}).get("text/plain")
            if isinstance(plain, str):
                self.said.setdefault(cell_index, []).append(plain)
        return super().process_message(msg, cell, cell_index)


def executed_with_lines(
    sources: list[str], directory: Path, *, timeout: int = 120
) -> tuple[Any, dict[int, list[str]]]:
    """``executed``, and each cell's display texts in the order the user saw them (a status
    line's every update)."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    client = _WatchingClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": directory}},
    )
    client.said = {}
    client.execute()
    return notebook, client.said


def connected_cells(url: str, monkeypatch: pytest.MonkeyPatch, *cells: str) -> list[str]:
    """A notebook's sources: the extension loaded (cell 0) and connected to ``url`` (cell 1),
    then ``cells``; the kernel inherits no ``KCORAL_URL`` or ``KCORAL_TOKEN`` of the run's."""
    monkeypatch.delenv("KCORAL_URL", raising=False)
    monkeypatch.delenv("KCORAL_TOKEN", raising=False)
    return ["%load_ext kcoral", f"%kcoral connect {url}", *cells]


def executed_on_a_token_server(cells: list[str], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A new notebook of the extension connected to a real CPU server that asks for a token,
    as the README starts one (the kernel reads it from ``KCORAL_TOKEN``), then ``cells``,
    after a real kernel (nbclient) ran it; the server is stopped afterwards."""
    token = secrets.token_urlsafe(16)
    with (
        running_server(
            tmp_path_factory.mktemp("token-server"),
            ["--log-dir", "", "--num-workers", "1"],
            env={"KCORAL_AUTH_TOKEN": token},
        ) as server,
        pytest.MonkeyPatch.context() as monkeypatch,
    ):
        sources = connected_cells(server.url, monkeypatch, *cells)
        monkeypatch.setenv("KCORAL_TOKEN", token)  # the kernel inherits it
        return executed(sources, tmp_path_factory.mktemp("notebook"))
