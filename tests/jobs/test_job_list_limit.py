"""``GET /v1/jobs`` lists at most ``?limit=N`` jobs, newest first (EXTENSIONS §5).

It listed every retained job of the caller: with many of them an answer grew without bound
(about 600 bytes a job; ``--job-retention-bytes`` keeps hundreds of thousands of small ones),
and a router left out, without a word, a node whose list passed the 64 MiB it fetches.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from email.message import Message

import pytest
from job_helpers import module_program

import kcoral

TRIVIAL = "def one():\n    return 1\n"
JOBS = 5


def _get(url: str) -> tuple[int, Message, object]:
    try:
        with urllib.request.urlopen(url, timeout=60) as answer:
            return answer.status, answer.headers, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, refused.headers, json.loads(refused.read())


def test_a_job_list_holds_the_newest_limit_jobs_and_says_how_many_it_left_out(
    kcoral_server,
) -> None:
    with kcoral.Client(kcoral_server.url) as client:
        submitted = [client.submit(module_program(TRIVIAL, "one")) for _ in range(JOBS)]
        for job in submitted:
            job.result(timeout=120)
        newest_first = [job.id for job in reversed(submitted)]
        status, headers, listed = _get(f"{kcoral_server.url}/v1/jobs?limit=2")
        assert status == 200
        assert [job["job_id"] for job in listed] == newest_first[:2]  # type: ignore[union-attr]
        assert headers["X-KCoral-Jobs-Left-Out"] == str(JOBS - 2)
        status, headers, listed = _get(f"{kcoral_server.url}/v1/jobs")  # default 1000
        assert [job["job_id"] for job in listed] == newest_first  # type: ignore[union-attr]
        assert headers["X-KCoral-Jobs-Left-Out"] == "0"
        status, headers, listed = _get(f"{kcoral_server.url}/v1/jobs?limit=99999999999999")
        assert status == 200 and len(listed) == JOBS  # type: ignore[arg-type]
        for bad in ("0", "-1", "two", "1.5"):
            status, _headers, refused = _get(f"{kcoral_server.url}/v1/jobs?limit={bad}")
            assert status == 400, bad
            assert refused["error"] == {  # type: ignore[index]
                "kind": "parse",
                "message": "limit must be an integer from 1 to 10000",
            }
        assert [job["job_id"] for job in client.jobs(limit=3)] == newest_first[:3]
        assert len(client.jobs()) == JOBS
        with pytest.raises(ValueError, match="limit must be a positive integer"):
            client.jobs(limit=0)
