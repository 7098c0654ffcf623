"""A malicious KCoral server against what the client shows: ``kcoral run``'s exit status, a
``%%kcoral`` cell, the notebook's status screens.

The attacker is the server: a fake KCoral server on loopback answers with well-formed
protocol documents whose contents no honest server sends (a runner status with the wrong
types, a signal number that wraps the exit status, job state with GPU ids that are not
indices, a cell record whose torch names are lists, integers too big for a float). The
client must say the answer is invalid (a ``ProtocolError``, or ``kcoral run``'s "invalid
response from the server" with status 1) or show a dash, never a raw traceback, and never
turn a failure into exit status 0.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import tornado.web
from IPython.utils.capture import capture_output
from kcoral_jupyter.display import format_ms, wait_text
from kcoral_jupyter.notebook_session import seconds_text, status_rows
from kcoral_shell import kcoral_shell
from stand_in_http import serving_app

import kcoral
from kcoral import Client, Program, ProtocolError
from kcoral.bench.results import format_comparison
from kcoral.cli import main as kcoral_main
from kcoral.protocol.strict_json import finite_float
from kcoral.protocol.values import encode_value

pytestmark = pytest.mark.timeout(300)

#: Strict JSON carries integers of up to 4,300 digits; a float holds about 309.
HUGE = 10**400


def completed(results: dict[str, Any]) -> str:
    """A ``COMPLETED`` answer whose results are JSON values (no binary parts)."""
    nodes = {}
    for key, value in results.items():
        nodes[key], parts = encode_value(value, 0)
        assert not parts
    return json.dumps(
        {
            "status": "COMPLETED",
            "request_id": str(uuid.uuid4()),
            **dict.fromkeys(("queue_ms", "elapsed_ms", "lease_wait_ms", "lease_held_ms"), 0.0),
            "results": nodes,
            "stdout": "",
            "stderr": "",
        }
    )


@contextlib.contextmanager
def fake_server(
    results: dict[str, Any],
    *,
    info: dict[str, Any] | None = None,
    job_state: dict[str, Any] | None = None,
    jobs: list[dict[str, Any]] | None = None,
    gpu_count: int = 0,
) -> Iterator[str]:
    """``/execute`` and a job's result answer ``results``; ``/v1/info``, a job's state and
    the job list answer what they are given."""

    class Json(tornado.web.RequestHandler):
        def initialize(self, body: Callable[[], Any]) -> None:
            self.body = body

        def get(self, *_: str) -> None:
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(self.body()))

    class Execute(tornado.web.RequestHandler):
        def post(self) -> None:
            self.set_header("Content-Type", "application/json")
            self.finish(completed(results))

        def get(self, _job_id: str) -> None:  # GET /v1/jobs/{id}/result
            self.post()

    class Jobs(Json):
        def post(self) -> None:
            self.set_status(202)
            self.finish({"job_id": "job-1", "request_id": str(uuid.uuid4()), "status": "QUEUED"})

    class Events(tornado.web.RequestHandler):
        def get(self, _job_id: str) -> None:
            self.set_header("Content-Type", "text/event-stream")
            self.finish('id: 1\nevent: phase\ndata: {"phase":"finished","status":"COMPLETED"}\n\n')

    features = ["jobs"] if job_state is not None or jobs is not None else []
    about = {"kcoral": kcoral.__version__, "features": features, "device": "cpu", **(info or {})}

    def app() -> tornado.web.Application:
        return tornado.web.Application(
            [
                (r"/health", Json, {"body": lambda: {"status": "ok", "gpu_count": gpu_count}}),
                (r"/v1/info", Json, {"body": lambda: about}),
                (r"/execute", Execute),
                (r"/v1/jobs", Jobs, {"body": lambda: jobs or []}),
                (r"/v1/jobs/([^/]+)/events", Events),
                (r"/v1/jobs/([^/]+)/result", Execute),
                (r"/v1/jobs/([^/]+)", Json, {"body": lambda: job_state or {}}),
            ]
        )

    with serving_app(app) as url:
        yield url


# ------------------------------------------------------------------------- kcoral run


def kcoral_run(url: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = kcoral_main(["run", "python", "--url", url, "--", "-c", "pass"])
    return status, capsys.readouterr().err


@pytest.mark.parametrize(
    "runner_status",
    [
        {"exit_code": 0, "missing": ["out.txt"]},  # strings where objects belong
        {"exit_code": 0, "missing": {"path": "x"}},
        {"exit_code": 0, "skipped": 7},  # not a list
        {"exit_code": 0, "skipped": "abc"},
        {"exit_code": 0, "links": "abc"},
    ],
)
def test_a_malformed_runner_status_is_an_invalid_response_not_a_traceback(
    runner_status: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    with fake_server({"status": runner_status}) as url:
        status, err = kcoral_run(url, capsys)
    assert status == 1
    assert "invalid response from the server" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("signal", [128, -128, 0, 65, 2**70, True])
def test_a_signal_number_out_of_range_never_wraps_the_exit_status_to_zero(
    signal: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with fake_server({"status": {"signal": signal}}) as url:
        status, _ = kcoral_run(url, capsys)
    assert status == 1


@pytest.mark.parametrize(("signal", "expected"), [(9, 137), (1, 129), (64, 192)])
def test_a_real_signal_is_128_plus_its_number(
    signal: int, expected: int, capsys: pytest.CaptureFixture[str]
) -> None:
    with fake_server({"status": {"signal": signal}}) as url:
        status, _ = kcoral_run(url, capsys)
    assert status == expected


# --------------------------------------------------------------------- %%kcoral cells


def run_cell(url: str, monkeypatch: pytest.MonkeyPatch, source: str) -> tuple[Any, Any]:
    with kcoral_shell(url, monkeypatch, ("x", "y")) as ip, capture_output() as captured:
        result = ip.run_cell(source)
    return result, captured


def cell(**fields: Any) -> dict[str, Any]:
    return {"cell": {"outputs": {}, "has_value": False, **fields}}


@pytest.mark.parametrize("gpu_ids", [["zero"], [None], [[0]], [True], [-1], [1.5]])
def test_job_state_gpu_ids_that_are_not_indices_are_dropped_after_a_successful_cell(
    gpu_ids: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    state = {"job_id": "job-1", "status": "COMPLETED", "gpu_ids": gpu_ids}
    with fake_server(cell(), job_state=state) as url:
        result, _ = run_cell(url, monkeypatch, "%%kcoral\nx = 1\n")
    assert result.error_in_exec is None, result.error_in_exec


def test_job_state_gpu_ids_that_are_indices_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"job_id": "job-1", "status": "COMPLETED", "gpu_ids": [0, 3]}
    with fake_server(cell(), job_state=state, gpu_count=4) as url:
        result, captured = run_cell(url, monkeypatch, "%%kcoral\nx = 1\n")
    assert result.error_in_exec is None, result.error_in_exec
    shown = " ".join(o.data.get("text/plain", "") for o in captured.outputs)
    assert "GPU [0, 3]" in shown, shown


@pytest.mark.parametrize("torch", [[["y"]], [{"a": 1}], [None], "y"])
def test_a_cell_record_whose_torch_names_are_not_strings_is_a_protocol_error(
    torch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with fake_server(cell(outputs={"y": 1}, torch=torch)) as url:
        result, _ = run_cell(url, monkeypatch, "%%kcoral -o y\ny = 1\n")
    assert isinstance(result.error_in_exec, ProtocolError), result.error_in_exec
    assert "torch names" in str(result.error_in_exec)


# ------------------------------------------------------- integers too big for a float


def test_finite_float_takes_only_finite_numbers_and_never_overflows() -> None:
    assert finite_float(3) == 3.0 and finite_float(2.5) == 2.5
    for value in (HUGE, -HUGE, float("inf"), float("nan"), True, "1", None):
        assert finite_float(value) is None


def test_the_number_screens_show_a_dash_or_text_for_a_huge_integer() -> None:
    assert format_ms(HUGE) == "–" and format_ms(12.5) == "13 ms"
    assert wait_text(HUGE) == "\u2014" and wait_text(90) == "1.5 min"
    assert seconds_text(600) == "600 s" and seconds_text(HUGE) == f"{HUGE} s"
    rows = dict(
        status_rows({"state": "IDLE", "idle_deadline": HUGE, "memory_bytes": HUGE}, None, now=0.0)
    )
    assert rows["idle deadline"] == "none while a program runs"
    assert "memory" not in rows  # format_size of it raised OverflowError


def test_huge_integers_in_the_jobs_and_fleet_screens_show_dashes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet = {"kinds": [{"gpu": "h100", "nodes": 1, "estimated_wait_seconds": HUGE}]}
    jobs = [{"job_id": "j1", "status": "COMPLETED", "elapsed_ms": HUGE}]
    with (
        fake_server({}, info={"fleet_status": fleet}, jobs=jobs) as url,
        kcoral_shell(url, monkeypatch, ()) as ip,
    ):
        for line in ("%kcoral jobs", "%kcoral status"):
            with capture_output():
                result = ip.run_cell(line)
            assert result.error_in_exec is None, (line, result.error_in_exec)


def test_a_benchmark_result_with_a_huge_integer_renders_as_text_and_html() -> None:
    bench = {"kind": "kcoral.benchmark", "label": "k", "latency_ms_median": HUGE}
    with fake_server({"bench": bench}) as url, Client(url) as client:
        program = Program()
        program.return_(key="k", value=program.upload(kind="bytes", value=b"k", id="k"))
        result = client.execute(program)
    assert "k" in format_comparison(result["bench"])
    assert "kcoral" in result._repr_html_()
