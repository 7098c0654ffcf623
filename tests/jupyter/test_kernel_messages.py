"""What a notebook user sees in a real kernel (nbclient), issue 20: a dead URL and an
interrupt end in two lines, a failed connect leaves the kernel unconnected, an explicit
``--gpus`` on a CPU server warns, tensors come back as their remote type, abbreviations are
refused, and the hint for a name that was not sent."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from notebook_cells import shown
from notebook_screenshot import screenshot

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

README = Path(__file__).resolve().parents[2] / "README.md"
DEAD = "127.0.0.1:9"  # the discard port: nothing listens there
SLEEPING_CELL = "%%kcoral\nimport time\nprint('started', flush=True)\ntime.sleep(120)\n"


def error_of(cell) -> dict:
    errors = [o for o in cell.outputs if o.output_type == "error"]
    assert len(errors) == 1, cell.outputs
    return errors[0]


def test_a_notebook_session_sees_short_errors_and_nothing_silent(
    cpu_server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KCORAL_URL", raising=False)
    monkeypatch.delenv("KCORAL_TOKEN", raising=False)
    bare = cpu_server_url.removeprefix("http://")
    sources = [
        "%load_ext kcoral",
        f"%kcoral connect {DEAD}",  # 1: fails in two lines
        "%%kcoral\n1\n",  # 2: not connected: says so, starts nothing
        f"%kcoral connect {bare}",  # 3: host:port gets http://
        "%%kcoral --gpus 1 -o t\nimport torch\nt = torch.ones(2)\nt.sum()\n",  # 4
        "(type(t).__module__, type(_).__module__)",  # 5
        "w = 5",
        "%%kcoral\nw * 2\n",  # 7: NameError with the -i hint
        "%%kcoral --gpu 1\n1\n",  # 8: abbreviation refused
        SLEEPING_CELL,  # 9: interrupted by nbclient's timeout
        "%kcoral --help",  # 10
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])

    def timeout_of(cell) -> int:
        return 15 if cell.source == SLEEPING_CELL else 120

    NotebookClient(
        notebook,
        timeout=120,
        timeout_func=timeout_of,
        interrupt_on_timeout=True,  # Jupyter's interrupt (SIGINT), as a user's Stop button
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": tmp_path}},
    ).execute()
    cells = notebook.cells

    dead = error_of(cells[1])
    assert dead["ename"] == "ServerUnreachableError"
    assert len(dead["traceback"]) == 2 and len("\n".join(dead["traceback"])) < 400
    assert "connection refused" in dead["traceback"][0]

    unconnected = error_of(cells[2])
    assert unconnected["ename"] == "NotConnectedError"
    assert f"%kcoral connect http://{DEAD} failed" in unconnected["traceback"][0]

    assert f"connected to {cpu_server_url}" in shown(cells[3], tracebacks=False)

    assert "ran on CPU (this server has no GPU)" in shown(cells[4], tracebacks=False)
    assert "\u26a0" in shown(cells[4], tracebacks=False)
    assert "('torch', 'torch')" in shown(cells[5], tracebacks=False)

    hint = error_of(cells[7])
    assert hint["ename"] == "RemoteCellError"
    assert hint["traceback"][-1].endswith("send it with -i w")
    # The README shows this error's first line as it comes, but for the job id and the URL
    # (before, it showed the remote NameError's own line, which comes after the traceback).
    first = re.sub(r"\x1b\[[0-9;]*m", "", hint["traceback"][0])
    first = re.sub(r"job [0-9a-f-]{36} on \S+ ", "job 8b66… on http://127.0.0.1:8123 ", first)
    assert f"  {first}\n" in README.read_text(encoding="utf-8"), first

    # IPython shows a UsageError as one stderr line, not as an error output.
    assert "UsageError: %%kcoral: unrecognized arguments: --gpu 1" in shown(
        cells[8], tracebacks=False
    )

    interrupted = error_of(cells[9])
    assert interrupted["ename"] == "CellCancelledError", interrupted
    assert len(interrupted["traceback"]) == 2, interrupted["traceback"]
    assert "cancelled" in interrupted["traceback"][0]

    assert "Types:" in shown(cells[10], tracebacks=False)
    # With KCORAL_SCREENSHOT_DIR set: the README's picture (without the long --help text).
    screenshot(notebook.cells[:10], "notebook-messages.png", tmp_path, height=1130)
