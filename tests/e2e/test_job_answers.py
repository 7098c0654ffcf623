"""Job answers (EXTENSIONS §5): exactly the documented fields, and the request id of a job's
body in its result's X-Request-ID.

Moved from the conformance audit of the core against the specs (each test pins one
normative statement no other test did).
"""

from __future__ import annotations

import re
from typing import Any

from e2e_support import (
    RESULT_FIELDS,
    execute_body,
    is_canonical_uuid,
    request,
)
from waiting import wait_for

# PROTOCOL §12: `started_at` is RFC 3339 UTC with `Z` (fractional seconds optional).
RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
JOB_FIELDS = {
    "job_id",
    "request_id",
    "status",
    "submitted_at",
    "started_at",
    "finished_at",
    "worker_id",
    "gpu_ids",
    "target",
    "queue_position",
    "queue_ms",
    "lease_wait_ms",
    "lease_held_ms",
    "elapsed_ms",
    "error_kind",
    "owner",
    "waiting_for",  # EXTENSIONS §5, added 2026-12 (lease mend)
}
FINISHED_JOB_STATUSES = {"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT", "ERROR"}
ONE = "def f():\n    return 1\n"


def module_upload(source: str) -> dict[str, Any]:
    return {"op": "upload", "kind": "module", "id": "m", "source": source}


def call_and_return(name: str, key: str = "out") -> list[dict[str, Any]]:
    return [
        {"op": "get_function", "id": name, "module": {"$ref": "m"}, "name": name},
        {"op": "run", "id": f"{name}_out", "fn": {"$ref": name}},
        {"op": "return", "key": key, "value": {"$ref": f"{name}_out"}},
    ]


def submit_raw(url: str, document: dict[str, Any]):
    content_type, body = execute_body(document)
    return request(url, "POST", "/v1/jobs", body, {"Content-Type": content_type})


def finished_job(url: str, job_id: str) -> dict[str, Any]:
    def state() -> dict[str, Any] | None:
        body = request(url, "GET", f"/v1/jobs/{job_id}").body
        return body if body["status"] in FINISHED_JOB_STATUSES else None

    return wait_for(state, f"job {job_id} to finish", 60.0)


def test_job_answers_have_exactly_the_documented_fields(e2e_server):
    url = e2e_server.url
    submitted = submit_raw(url, {"instructions": [module_upload(ONE), *call_and_return("f")]})
    assert submitted.status == 202
    assert submitted.headers["Content-Type"] == "application/json"
    assert set(submitted.body) == {"job_id", "request_id", "status"}
    assert submitted.body["status"] == "QUEUED"
    assert is_canonical_uuid(submitted.body["job_id"])
    assert submitted.header_values("X-Request-ID") == [submitted.body["request_id"]]
    job_id = submitted.body["job_id"]
    state = finished_job(url, job_id)
    assert set(state) == JOB_FIELDS and state["status"] == "COMPLETED"
    assert state["request_id"] == submitted.body["request_id"]
    for name in ("submitted_at", "started_at", "finished_at"):
        assert RFC3339_UTC.fullmatch(state[name]), name
    listed = request(url, "GET", "/v1/jobs").body
    assert isinstance(listed, list) and all(set(item) == JOB_FIELDS for item in listed)
    assert job_id in [item["job_id"] for item in listed]
    result = request(url, "GET", f"/v1/jobs/{job_id}/result")
    assert result.status == 200 and set(result.body) == RESULT_FIELDS
    assert result.body["results"] == {"out": {"type": "integer", "value": 1}}


def test_a_job_result_carries_the_request_id_of_its_body_in_x_request_id(e2e_server):
    url = e2e_server.url
    submitted = submit_raw(url, {"instructions": [module_upload(ONE), *call_and_return("f")]})
    finished_job(url, submitted.body["job_id"])
    result = request(url, "GET", f"/v1/jobs/{submitted.body['job_id']}/result")
    assert result.body["request_id"] == submitted.body["request_id"]
    assert result.header_values("X-Request-ID") == [result.body["request_id"]]
