"""The example notebooks, executed top to bottom by nbclient on a real kernel, twice each:

* ``embedded``: as the README's first command leaves them (no ``KCORAL_URL``, no
  ``KCORAL_TOKEN``): the kernel starts its own embedded server, with its own fresh token;
* ``token``: against a token-protected CPU server named by ``KCORAL_URL``/``KCORAL_TOKEN``.

nbclient stops at the first error output of a cell not tagged ``raises-exception``, so a run
that finishes had no unexpected error; the token never appears in the saved notebook.
"""

from __future__ import annotations

import ast
import re
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from kcoral_server.processes import sandbox
from nbclient import NotebookClient
from notebook_screenshot import screenshot
from server_process import running_server

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@dataclass(frozen=True)
class Connection:
    """How the kernel finds its server: ``url``/``token`` in its environment, or neither."""

    name: str
    url: str | None = None
    token: str | None = None


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Connection]:
    """A CPU server that refuses requests without its bearer token (pickle allowed)."""
    token = secrets.token_urlsafe(24)
    with running_server(
        tmp_path_factory.mktemp("token-server"),
        ["--log-dir", "", "--num-workers", "2"],
        env={"KCORAL_AUTH_TOKEN": token, "KCORAL_ALLOWED_SERIALIZATION": "json,pickle"},
    ) as server:
        yield Connection("token", server.url, token)


@pytest.fixture(params=["embedded", "token"])
def connection(request: pytest.FixtureRequest) -> Connection:
    if request.param == "embedded":
        return Connection("embedded")
    return request.getfixturevalue("token_server")


def execute(name: str, connection: Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    if connection.name == "embedded":  # the kernel's server as the README starts it
        monkeypatch.delenv("KCORAL_WORKER_PRELOAD", raising=False)  # torch, not the suite's
    for variable, value in (("KCORAL_URL", connection.url), ("KCORAL_TOKEN", connection.token)):
        if value is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, value)
    notebook = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": tmp_path}},
        # one output per stream, as JupyterLab shows and saves them: a print's pieces arrive
        # in separate messages when a status line update comes between, and each piece was
        # its own block in the README picture ("scaling a" / "(3, 4) tensor by 2.5")
        coalesce_streams=True,
    ).execute()
    saved = nbformat.writes(notebook)
    if connection.token:
        assert connection.token not in saved
    assert "Bearer " not in saved
    magics = any("%load_ext kcoral" in cell.source for cell in notebook.cells)
    if connection.name == "embedded" and magics:  # the kernel's own server ran the cells
        assert "starting a local server for this kernel's lifetime" in saved
        assert "local server running at http://127.0.0.1:" in saved
    return notebook


def texts(cell) -> str:
    parts: list[tuple[str, str | None]] = []  # (text, stream name or None)
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            name, text = output.get("name"), output.get("text", "")
            if parts and parts[-1][1] == name:
                # Live output arrives in chunks cut wherever a read happened to end; Jupyter
                # shows consecutive stream outputs as one text, and so do we.
                parts[-1] = (parts[-1][0] + text, name)
            else:
                parts.append((text, name))
            continue
        data = output.get("data", {})
        parts.append((data.get("text/plain", ""), None))
        parts.append((data.get("text/html", ""), None))
        parts.extend((line, None) for line in output.get("traceback", []))
    return "\n".join(text for text, _name in parts)


def test_the_quickstart_notebook_runs_end_to_end(connection, tmp_path, monkeypatch) -> None:
    notebook = execute("quickstart.ipynb", connection, tmp_path, monkeypatch)
    cells = [c for c in notebook.cells if c.cell_type == "code"]
    everything = [texts(c) for c in cells]
    # the magic with --in/--out: stdout, the final value, provenance, summary
    magic = next(c for c in cells if c.source.startswith("%%kcoral -i x,scale"))
    assert "scaling a (3, 4) tensor by 2.5" in texts(magic)
    assert "COMPLETED" in texts(magic) and "ran on CPU" in texts(magic)
    result = next(o for o in magic.outputs if o.output_type == "execute_result")
    assert float(result["data"]["text/plain"]) == pytest.approx(12 * 1 + 2.5 * 6.0)
    assert result["metadata"]["kcoral"]["request_id"]
    # the tensor rendered with a heatmap, the returned file, the deliberate failure
    assert any("kcoral-heatmap" in t and "shape (3, 4)" in t for t in everything)
    # the returned report computes what it says: y = x * 2.5 + 1, x evenly from 0 to 1
    assert any("mean of y: 2.25" in t and "report.txt" in t for t in everything)
    failed = next(c for c in cells if "raises-exception" in c.metadata.get("tags", []))
    error = next(o for o in failed.outputs if o.output_type == "error")
    assert error["ename"] == "RemoteCellError"
    assert "deliberate failure: 2 != 3" in "\n".join(error["traceback"])
    # the Client API result renders as HTML with its table
    assert any("kcoral-result" in t and "grid" in t for t in everything)
    # --noblock + attach (both servers offer jobs), through the kernel's client
    assert any("submitted" in t for t in everything)
    assert any("background done" in t for t in everything)
    if connection.name == "embedded":  # as the README runs it: its picture
        # The README and the notebook say which cell starts the kernel's server: its first,
        # `%kcoral url` (they said the first %%kcoral cell, which finds it running).
        assert cells[0].source.splitlines()[1] == "url = %kcoral url"
        assert "starting a local server for this kernel's lifetime" in texts(cells[0])
        said = "its first cell (`%kcoral url`) starts a local `kcoral server` for the kernel"
        assert said in " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
        introduction = notebook.cells[0].source
        assert "the first cell that needs a server (`%kcoral url` below)" in introduction
        screenshot(notebook.cells, "quickstart.png", tmp_path, height=3000)


def test_the_benchmark_notebook_says_it_ran_on_cpu(connection, tmp_path, monkeypatch) -> None:
    notebook = execute("benchmark_kernel.ipynb", connection, tmp_path, monkeypatch)
    output = "\n".join(texts(c) for c in notebook.cells if c.cell_type == "code")
    assert "512x512 matmul on cpu" in output
    assert "No GPU on this server: the kernel ran on the CPU" in output
    assert "GFLOP/s" in output


def test_the_remote_functions_notebook_shows_both_formats_and_async_calls(
    connection, tmp_path, monkeypatch
) -> None:
    scratch_root = tmp_path / "tmp"  # where the notebook's own server keeps its files
    scratch_root.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch_root))
    notebook = execute("remote_functions.ipynb", connection, tmp_path, monkeypatch)
    # its clean-up cell removes them (it left a kcoral-notebook-* folder in /tmp every run)
    assert not list(scratch_root.glob("kcoral-notebook-*"))
    outputs = "\n".join(texts(c) for c in notebook.cells if c.cell_type == "code")
    assert "{'mean': 4.666666666666667, 'n': 3}" in outputs  # JSON mode, defaults bound
    assert "ValueError:" in outputs and "offset" in outputs  # JSON refuses outside globals
    assert "Point(x=11, y=12)" in outputs  # pickle: a closure over a notebook dataclass
    assert "[0 1 4 9]" in outputs  # pickle: a lambda on a NumPy array
    assert "ZeroDivisionError" in outputs  # RemoteExecutionError with the remote traceback
    assert "dividing 1 by 0" in outputs  # the function's print reaches the cell
    if sys.version_info >= (3, 11):  # the note: the notebook's own line, not <uploaded:...>
        assert "in divide\n    return a / b" in outputs and "<uploaded:" not in outputs
    assert "49" in outputs and "[0, 1, 4, 9, 16, 25, 36, 49]" in outputs  # async def, gather
    assert "HELLO" in outputs  # AsyncClient
    # Its words on asyncio.gather name the workers that run the calls at once: its 8 calls of
    # 0.5 s took 4.1 s on a one-worker server (kcoral server's default), with nothing said.
    source = nbformat.read(ROOT / "notebooks" / "remote_functions.ipynb", as_version=4).cells
    started = re.search(r'"--num-workers",\s*"(\d+)"', source[1].source)
    assert started is not None, source[1].source
    words = " ".join(" ".join(cell.source for cell in source).split())
    assert f"the server this notebook starts has {started[1]}, a plain `kcoral server` 1" in words
    if connection.name == "embedded":  # the server the notebook starts keeps the safe default
        # (it passed --sandbox none: a notebook that teaches the API taught running unconfined)
        expected = "none" if sandbox.probe() else "bubblewrap"
        assert re.search(rf"http://127\.0\.0\.1:\d+ sandbox: {expected}\n", outputs), outputs


def test_the_sessions_notebook_builds_once_and_compares_with_stateless_cells(
    connection, tmp_path, monkeypatch
) -> None:
    notebook = execute("sessions.ipynb", connection, tmp_path, monkeypatch)
    cells = [c for c in notebook.cells if c.cell_type == "code"]
    outputs = "\n".join(texts(c) for c in cells)
    assert "started on" in outputs and "session id" in outputs
    # built once in the session; the next cells found the model, -i/-o moved values
    assert outputs.count("built and trained in") == 1 + 3  # the session's, three stateless
    accuracy = next(c for c in cells if "held-out accuracy" in c.source)
    assert re.search(r"held-out accuracy: [01]\.\d{3}", texts(accuracy))
    predicted = next(c for c in cells if c.source == "predicted")
    assert len(ast.literal_eval(texts(predicted))) == 5  # five class indices, back by -o
    assert "state: IDLE" in outputs and "programs: 3" in outputs
    # the comparison, computed in the notebook (its numbers are the machine's, not asserted)
    assert "ended" in outputs and "without a session again" in outputs
    assert "a stateless cell took" in outputs and "x the time of a session cell" in outputs
