"""Large cached blobs are views of their sealed request bodies (PROTOCOL §9.1, §13).

The memory cache keeps such a body's descriptor open, and ``/internal/worker-status`` counts
it (``cache_descriptors``), so the leak checks subtract exactly those: a descriptor the cache
does not hold is still a leak. A program that tries to change the cached bytes (through its
own mapping of the body, or by opening the front-end's memfd under ``/proc``) changes nothing
any later request sees, because the body was sealed once received.
"""

from __future__ import annotations

import os
import socket

import pytest
from reliability_support import (
    address,
    assert_no_leaks,
    cache_descriptors,
    execute,
    get,
    settle,
    sha256,
)
from waiting import wait_until

pytestmark = pytest.mark.slow

BLOB = os.urandom(1 << 16) * 32  # 2 MiB: cached as a view of its body
# what one such body keeps open: its memfd and the duplicate Python's mmap holds
HELD = 2
ECHO = "def echo(value):\n    return value\n"
# Writes into every mapping of a request body this process has (made writable first), and
# into every front-end memfd it can open through /proc: [mappings scribbled over, memfds
# opened for writing, memfd writes that succeeded].
SCRIBBLE = """
import ctypes, mmap, os
def scribble(value):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    mapped = opened = written = 0
    for line in open("/proc/self/maps"):
        if "kcoral-request" in line:
            low, high = (int(x, 16) for x in line.split()[0].split("-"))
            if libc.mprotect(low, high - low, mmap.PROT_READ | mmap.PROT_WRITE) == 0:
                ctypes.memset(low, 0x41, high - low)
                mapped += 1
    for pid in os.listdir("/proc"):
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for name in names:
            path = f"/proc/{pid}/fd/{name}"
            try:
                if "kcoral-request" not in os.readlink(path):
                    continue
                fd = os.open(path, os.O_RDWR)
            except OSError:
                continue
            opened += 1
            try:
                os.pwrite(fd, b"A" * 4096, 4096)
                written += 1
            except OSError:
                pass
            finally:
                os.close(fd)
    return [mapped, opened, written]
"""


def bytes_program(source: str, function: str) -> dict:
    return {
        "instructions": [
            {"op": "upload", "id": "b", "kind": "bytes", "blob": sha256(BLOB)},
            {"op": "upload", "id": "m", "kind": "module", "source": source},
            {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": function},
            {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": [{"$ref": "b"}]},
            {"op": "return", "key": "value", "value": {"$ref": "r"}},
        ]
    }


def echoed(answer) -> bytes:
    assert answer.status == 200 and answer.body["status"] == "COMPLETED", answer.body
    return answer.parts["return:0"]


def test_a_cached_large_blob_holds_one_descriptor_that_the_leak_check_does_not_count(
    watched_server,
):
    server = watched_server("--num-workers", "1", "--max-requests-per-worker", "0")
    assert cache_descriptors(server.url) == 0
    assert echoed(execute(server.url, bytes_program(ECHO, "echo"), [BLOB])) == BLOB
    assert wait_until(lambda: cache_descriptors(server.url) == HELD, 30.0)
    # warm: no blob sent, the worker gets the cached body's descriptor
    assert echoed(execute(server.url, bytes_program(ECHO, "echo"))) == BLOB
    assert cache_descriptors(server.url) == HELD
    # the same blob sent again: cached already, so this body closes with its request
    assert echoed(execute(server.url, bytes_program(ECHO, "echo"), [BLOB])) == BLOB
    assert cache_descriptors(server.url) == HELD
    assert_no_leaks(server.pid, server.temp_dir, server.baseline)


def test_a_descriptor_the_cache_does_not_hold_is_still_a_leak(watched_server):
    server = watched_server("--num-workers", "1", "--max-requests-per-worker", "0")
    assert echoed(execute(server.url, bytes_program(ECHO, "echo"), [BLOB])) == BLOB
    assert_no_leaks(server.pid, server.temp_dir, server.baseline)
    # The leak on purpose: a connection the front-end accepted and keeps open is one more
    # descriptor, which the cache's count must not hide.
    with socket.create_connection(address(server.url)) as held:
        held.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert held.recv(1 << 16).startswith(b"HTTP/1.1 200")
        leaked = settle(server.pid, server.temp_dir, server.baseline, timeout=2.0)
        assert leaked.fds > server.baseline.fds
    assert_no_leaks(server.pid, server.temp_dir, server.baseline)


def test_a_program_that_writes_into_its_blob_changes_nothing_a_later_request_sees(
    watched_server,
):
    server = watched_server("--num-workers", "1", "--max-requests-per-worker", "0")
    assert echoed(execute(server.url, bytes_program(ECHO, "echo"), [BLOB])) == BLOB
    attack = execute(server.url, bytes_program(SCRIBBLE, "scribble"))
    assert attack.status == 200 and attack.body["status"] == "COMPLETED", attack.body
    mapped, opened, written = (item["value"] for item in attack.body["results"]["value"]["value"])
    assert mapped >= 1 and written == 0, (mapped, opened, written)
    # the program may scribble over its private copy of the mapping, never the shared body
    assert echoed(execute(server.url, bytes_program(ECHO, "echo"))) == BLOB
    status = get(server.url, "/internal/worker-status")
    assert status.body["cache_descriptors"] == HELD
    assert_no_leaks(server.pid, server.temp_dir, server.baseline)
