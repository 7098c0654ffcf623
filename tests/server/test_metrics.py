"""``GET /metrics`` of a real server (EXTENSIONS §13): what it counts after real requests,
and that its labels hold nothing a client chose."""

from __future__ import annotations

import hashlib
import threading

import pytest
from http_helpers import execute, get
from metrics_support import scrape
from prometheus_client.parser import text_string_to_metric_families
from raw_http import call_program
from server_process import start_server

SECRET_WORD = "pr0gram-c0ntent-never-in-metrics"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    running = start_server(tmp_path_factory.mktemp("metrics"), ["--num-workers", "1"])
    yield running
    running.stop()


def test_a_completed_program_is_counted_with_its_status_and_duration(server) -> None:
    before = scrape(server.url)
    assert execute(server.url, call_program("def main():\n    return 1\n")).status == 200
    after = scrape(server.url)
    key = 'kcoral_requests_total{error_kind="none",reason="completed",status="200"}'
    assert after[key] == before.get(key, 0) + 1
    duration = 'kcoral_request_duration_seconds_count{endpoint="execute"}'
    assert after[duration] == before.get(duration, 0) + 1
    assert after['kcoral_worker_starts_total{gpu="cpu"}'] >= 1
    assert after["kcoral_queue_depth"] == 0 and after["kcoral_session_seats_held"] == 0


def test_a_failing_program_is_counted_under_its_error_kind(server) -> None:
    source = f"def main():\n    raise ValueError({SECRET_WORD!r})\n"
    response = execute(server.url, call_program(source), headers={"X-Request-ID": SECRET_WORD})
    assert response.status == 200 and response.body["status"] == "FAILED"
    samples = scrape(server.url)
    key = 'kcoral_requests_total{error_kind="runtime",reason="program_failed",status="200"}'
    assert samples[key] >= 1
    assert not any(SECRET_WORD in name for name in samples)


def test_a_cache_miss_and_a_later_hit_are_counted_with_their_bytes(server) -> None:
    data = b"\x00" * 64
    sha = hashlib.sha256(data).hexdigest()
    program = {
        "instructions": [
            {"op": "upload", "id": "b", "kind": "bytes", "blob": sha},
            {"op": "return", "key": "value", "value": {"$ref": "b"}},
        ]
    }
    before = scrape(server.url)
    assert execute(server.url, program).body["status"] == "CACHE_MISS"
    assert execute(server.url, program, {sha: data}).status == 200
    assert execute(server.url, program).status == 200  # from the cache now
    after = scrape(server.url)
    assert after["kcoral_cache_misses_total"] == before.get("kcoral_cache_misses_total", 0) + 1
    assert after["kcoral_cache_hits_total"] == before.get("kcoral_cache_hits_total", 0) + 1
    hit_bytes = after["kcoral_cache_hit_bytes_total"] - before.get(
        "kcoral_cache_hit_bytes_total", 0
    )
    assert hit_bytes == len(data)
    assert after["kcoral_memory_cache_bytes"] >= len(data)


def test_an_unknown_error_kind_or_reason_is_counted_as_other() -> None:
    from kcoral_server.metrics.labels import ERROR_KINDS, gpu_label, one_of, status_label

    assert one_of("an-attacker's-kind", ERROR_KINDS) == "other"
    assert one_of(None, ERROR_KINDS) == "none" and one_of("runtime", ERROR_KINDS) == "runtime"
    assert status_label(1000) == "other" and status_label(404) == "404"
    assert gpu_label(7, frozenset({0, 1})) == "other" and gpu_label(None, frozenset()) == "cpu"


def test_a_path_below_an_endpoint_without_subpaths_is_counted_as_other() -> None:
    """A router labels a request's duration by its path: ``/health/x`` (a 404) was counted
    as a health check, ``/metrics/x`` as a scrape."""
    from kcoral_server.metrics.labels import endpoint_of

    assert [endpoint_of(p) for p in ("/health/x", "/metrics/x", "/v1/info/x")] == ["other"] * 3
    assert [endpoint_of(p) for p in ("/health", "/metrics", "/v1/info")] == [
        "health",
        "metrics",
        "info",
    ]
    assert endpoint_of("/v1/jobs/j1/events") == "jobs"
    assert endpoint_of("/v1/sessions/s1/execute") == "sessions"
    assert endpoint_of(None) == endpoint_of("/execute") == "execute"


WAITS_FOR_A_FILE = """
import os, time

def main(path):
    while not os.path.exists(path):
        time.sleep(0.05)
    return 1
"""


def test_the_capacity_metric_says_it_counts_busy_workers_too_as_health_does(
    server, tmp_path
) -> None:
    """``kcoral_request_capacity`` is /health's ``request_capacity``, busy and idle workers
    (PROTOCOL §12): while the one worker runs a program it reads 1 beside 1 in progress. Its
    help text said "workers that can take a request", so a Grafana tooltip or Prometheus's
    metadata made a full server read as one with a free worker."""
    release = tmp_path / "release"
    answers: list[int] = []
    program = call_program(WAITS_FOR_A_FILE, args=[str(release)])
    runner = threading.Thread(target=lambda: answers.append(execute(server.url, program).status))
    runner.start()
    try:
        running = scrape(server.url)
        while running["kcoral_requests_in_progress"] != 1:
            assert runner.is_alive(), answers
            running = scrape(server.url)
        text = get(server.url, "/metrics").raw.decode()
    finally:
        release.write_text("go")
        runner.join()
    assert answers == [200]
    assert running["kcoral_request_capacity"] == 1
    (family,) = [
        f for f in text_string_to_metric_families(text) if f.name == "kcoral_request_capacity"
    ]
    assert "busy and idle" in family.documentation, family.documentation


def test_a_program_as_long_as_the_default_longest_timeout_is_counted_in_a_finite_bucket() -> None:
    """The buckets ended at 10 min while a program may run 15 (``--max-timeout-seconds``'s
    default): a p95 of such programs' lease held or duration read 600 s, the last finite
    bound, however long they ran."""
    from kcoral_server.metrics.server_metrics import ServerMetrics
    from kcoral_server.settings.config import ServerConfig

    longest = ServerConfig().max_timeout_seconds
    metrics = ServerMetrics([0])
    metrics.record(
        "request_finished",
        {"http_status": 200, "finish_reason": "completed", "gpu_id": 0}
        | {"lease_wait_ms": 0.0, "lease_held_ms": longest * 1000.0},
    )
    families = text_string_to_metric_families(metrics.exposition().decode())
    held = next(f for f in families if f.name == "kcoral_lease_held_seconds")
    finite = [s for s in held.samples if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"]
    counted = [float(s.labels["le"]) for s in finite if s.value == 1]
    assert counted and min(counted) >= longest, finite[-3:]
