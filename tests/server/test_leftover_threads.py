"""Threads a program leaves running (EXTENSIONS §11, SERVER §8): a thread still alive after
its program's grace fails the program and retires the worker (a session ends with
``leftover_work``); a thread that ends within the grace, or the event loop's own executor
threads, are fine. Real servers, real workers."""

from __future__ import annotations

import json

import pytest
from http_helpers import execute_body, module_program, request

THREADS = """
import asyncio, json, os, threading, time
def sleeper():
    # the attack: work that would run on after the lease is released
    threading.Thread(target=time.sleep, args=(600,), name="kcoral-test-sleeper").start()
    return json.dumps(os.getpid())
def finishing():
    done = threading.Event()
    threading.Thread(target=done.wait, name="kcoral-test-finishing").start()
    done.set()  # it ends as soon as it runs again: within the grace
    return json.dumps(os.getpid())
async def in_executor():
    return json.dumps(await asyncio.to_thread(os.getpid))
def pid():
    return json.dumps(os.getpid())
"""


def _run(url: str, name: str, path: str = "/execute") -> dict:
    content_type, body = execute_body(module_program(THREADS, [(name, [])]))
    answer = request(url, "POST", path, body, {"Content-Type": content_type})
    assert answer.status == 200, answer.body
    return answer.body


def _value(body: dict, name: str) -> object:
    assert body["status"] == "COMPLETED", body
    return json.loads(body["results"][f"{name}#0"]["value"])


def test_a_session_program_that_leaves_a_thread_running_fails_and_ends_its_session(
    kcoral_server,
) -> None:
    url = kcoral_server.url
    sid = request(url, "POST", "/v1/sessions", b"{}").body["session_id"]
    path = f"/v1/sessions/{sid}/execute"
    failed = _run(url, "sleeper", path)
    assert failed["status"] == "FAILED" and failed["error"]["kind"] == "runtime"
    assert "kcoral-test-sleeper" in failed["error"]["message"]
    record = request(url, "GET", f"/v1/sessions/{sid}").body
    assert record["state"] == "ENDED" and record["end_reason"] == "leftover_work"
    assert "left threads or processes running" in record["end_message"]
    content_type, body = execute_body(module_program(THREADS, [("pid", [])]))
    refused = request(url, "POST", path, body, {"Content-Type": content_type})
    assert refused.status == 410 and refused.body["error"]["kind"] == "session_ended"


@pytest.mark.parametrize("kcoral_server", [["--num-workers", "1"]], indirect=True)
def test_a_stateless_program_that_leaves_a_thread_running_fails_and_its_worker_retires(
    kcoral_server,
) -> None:
    url = kcoral_server.url
    before = _value(_run(url, "pid"), "pid")  # the one reused worker
    failed = _run(url, "sleeper")
    assert failed["status"] == "FAILED" and failed["error"]["kind"] == "runtime"
    message = failed["error"]["message"]
    assert "kcoral-test-sleeper" in message and "worker was retired" in message
    # the next program runs on a fresh worker: the thread's process is gone
    assert _value(_run(url, "pid"), "pid") != before


def test_threads_that_end_with_their_program_keep_the_session(kcoral_server) -> None:
    url = kcoral_server.url
    sid = request(url, "POST", "/v1/sessions", b"{}").body["session_id"]
    path = f"/v1/sessions/{sid}/execute"
    pid = _value(_run(url, "finishing", path), "finishing")
    assert _value(_run(url, "in_executor", path), "in_executor") == pid
    assert _value(_run(url, "in_executor", path), "in_executor") == pid  # a new executor
    record = request(url, "GET", f"/v1/sessions/{sid}").body
    assert record["state"] == "IDLE" and record["programs"] == 3
