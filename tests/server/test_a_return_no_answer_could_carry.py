"""A return whose message to the front-end would pass what the front-end takes from a
worker (``--max-response-bytes`` plus its envelope, SERVER §14), against a real server: the
answer is the documented 500 ``response_too_large`` and the worker stays, as for any
answer over the limit. The front-end breaks a channel that brings such a message, so the
worker sends its size instead (``ReturnTooLarge``)."""

from __future__ import annotations

from pathlib import Path

from kcoral_server.processes.ipc import FRAME_ENVELOPE_BYTES
from raw_http import call_program, post_execute
from server_process import running_server

LIMIT = 1_000_000

SOURCE = f"""
import os

def text():
    return "x" * {LIMIT + FRAME_ENVELOPE_BYTES}

def pid():
    return os.getpid()
"""


def test_a_return_past_what_the_front_end_takes_is_the_500_and_its_worker_stays(
    tmp_path: Path,
) -> None:
    with running_server(
        tmp_path, ["--max-response-bytes", str(LIMIT), "--num-workers", "1"]
    ) as server:
        first = post_execute(server.url, call_program(SOURCE, "pid"), timeout=60)
        assert first.status == 200, first.raw[-2000:]
        answer = post_execute(server.url, call_program(SOURCE, "text"), timeout=60)
        assert answer.status == 500, answer.raw[-2000:]
        assert answer.body["error"]["kind"] == "response_too_large"
        message = answer.body["error"]["message"]
        assert message.startswith("results exceed the configured response-size limit: ")
        assert message.endswith(
            f"bytes, limit {LIMIT} bytes (max_response_bytes; kcoral server --max-response-bytes)"
        )
        after = post_execute(server.url, call_program(SOURCE, "pid"), timeout=60)
        assert after.status == 200, after.raw[-2000:]
        assert after.body["results"]["value"]["value"] == first.body["results"]["value"]["value"]
