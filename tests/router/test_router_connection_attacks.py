"""Issue 28 point 1 against a real router: connections that send one to three bytes, nothing,
or half a request head cost it nothing and are closed; the connections it has not yet
classified are bounded (the oldest goes); it takes all the descriptors its hard limit allows
and recovers once an attacker stops.

Anyone who reaches the router's port can open connections before any token is checked, so
each of these is an attack an unauthenticated stranger can make.
"""

from __future__ import annotations

import os
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from raw_http import read_until_closed
from router_helpers import RouterProcess, start_router
from waiting import wait_for

#: Long enough that only the behaviour under test (EOF, the bound) can close a connection.
NO_DEADLINE = ("--request-head-timeout-seconds", "600")
GENEROUS_SECONDS = 30.0


def socket_count(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except FileNotFoundError:
            pass  # closed while we looked
    return count


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


#: A router without nodes answers /health with 503 (ROUTER §9): an answer all the same.
NO_NODES = 503


def health_status(port: int) -> int | None:
    """``GET /health`` on a fresh connection: its status, or None when nothing answered."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=GENEROUS_SECONDS) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            answer = read_until_closed(sock)
    except OSError:
        return None
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


def settled_socket_count(pid: int) -> int:
    """The router's socket count once it stopped changing (listeners, gRPC, relays)."""
    previous = -1
    count = socket_count(pid)
    while count != previous:
        time.sleep(0.5)
        previous, count = count, socket_count(pid)
    return count


@pytest.fixture
def router_without_deadline(tmp_path: Path) -> Iterator[RouterProcess]:
    router = start_router(tmp_path, *NO_DEADLINE)
    try:
        yield router
    finally:
        router.stop()


@pytest.mark.parametrize("sent", [b"P", b"PR", b"PRI"], ids=["one", "two", "three"])
def test_a_client_that_sends_one_to_three_bytes_and_closes_leaves_the_router_idle(
    router_without_deadline: RouterProcess, sent: bytes
) -> None:
    router = router_without_deadline
    pid = router.process.pid
    assert health_status(router.port) == NO_NODES
    baseline = settled_socket_count(pid)
    for _ in range(20):
        attacker = socket.create_connection(("127.0.0.1", router.port))
        attacker.sendall(sent)
        attacker.close()
    # The router sees each hang-up although the bytes sit unread (the old peek loop spun on
    # them forever, each socket stuck in CLOSE-WAIT); no deadline is set that could hide it.
    wait_for(
        lambda: socket_count(pid) <= baseline,
        "the attackers' sockets closed",
        GENEROUS_SECONDS,
    )
    before = cpu_seconds(pid)
    time.sleep(3)
    # Behaviour, not speed: an idle router burns almost nothing; a spinning one burns ~3 s.
    assert cpu_seconds(pid) - before < 0.5
    assert health_status(router.port) == NO_NODES


def test_a_silent_connection_a_lone_p_and_a_half_sent_head_are_closed_at_the_deadline(
    tmp_path: Path,
) -> None:
    router = start_router(tmp_path, "--request-head-timeout-seconds", "1")
    try:
        attackers = []
        for sent in (b"", b"P", b"POST /v1/execute HTTP/1.1\r\nHost: 127.0.0.1\r\n"):
            attacker = socket.create_connection(("127.0.0.1", router.port))
            attacker.sendall(sent)
            attacker.settimeout(GENEROUS_SECONDS)  # far past the 1 s deadline
            attackers.append(attacker)
        for attacker in attackers:
            # Closed without an answer (the old router waited for ever, or an hour)
            assert read_until_closed(attacker) == b""
            attacker.close()
        assert health_status(router.port) == NO_NODES
    finally:
        router.stop()


def test_at_the_bound_the_oldest_unclassified_connection_is_dropped_not_the_new_one(
    tmp_path: Path,
) -> None:
    # 256 descriptors: a quarter, 64, may wait to be classified (listener.unclassified_bound)
    router = start_router(tmp_path, *NO_DEADLINE, open_files=(256, 256))
    silent: list[socket.socket] = []
    try:
        pid = router.process.pid
        baseline = settled_socket_count(pid)
        for _ in range(64):
            silent.append(socket.create_connection(("127.0.0.1", router.port)))
        wait_for(
            lambda: socket_count(pid) >= baseline + 64,
            "the router holds all 64",
            GENEROUS_SECONDS,
        )
        newcomer = socket.create_connection(("127.0.0.1", router.port))
        oldest = silent[0]
        oldest.settimeout(GENEROUS_SECONDS)
        assert read_until_closed(oldest) == b""
        # The newcomer is served although 63 silent connections still wait.
        newcomer.settimeout(GENEROUS_SECONDS)
        newcomer.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert read_until_closed(newcomer).startswith(b"HTTP/1.1 503 ")
        newcomer.close()
        for later in silent[1:]:
            later.setblocking(False)
            with pytest.raises(BlockingIOError):  # still open: only the oldest went
                later.recv(1)
    finally:
        for sock in silent:
            sock.close()
        router.stop()


def test_more_attackers_than_descriptors_leave_a_router_that_serves_again_once_they_stop(
    tmp_path: Path,
) -> None:
    router = start_router(tmp_path, *NO_DEADLINE, open_files=(256, 256))
    attackers: list[socket.socket] = []
    try:
        pid = router.process.pid
        baseline = settled_socket_count(pid)
        for _ in range(300):  # each holds a socket with one unread byte, more than fit
            attacker = socket.create_connection(("127.0.0.1", router.port))
            attacker.sendall(b"P")
            attackers.append(attacker)
        # Bounded: the router never holds more than its 64 unclassified connections.
        wait_for(
            lambda: socket_count(pid) <= baseline + 64,
            "the router shed the rest",
            GENEROUS_SECONDS,
        )
        assert health_status(router.port) == NO_NODES
        for attacker in attackers:
            attacker.close()
        attackers.clear()
        wait_for(
            lambda: socket_count(pid) <= baseline,
            "the router's sockets recovered",
            GENEROUS_SECONDS,
        )
        # (At 256 descriptors one of Tornado's bursts of up to 128 accepts may still meet
        # EMFILE once before the dropped sockets close; it retries on the next turn.)
        assert health_status(router.port) == NO_NODES
    finally:
        for attacker in attackers:
            attacker.close()
        router.stop()


def soft_and_hard_open_files(pid: int) -> tuple[str, str]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return soft, hard
    raise AssertionError("no open-files line")


def test_the_router_raises_its_soft_descriptor_limit_to_the_hard_one(tmp_path: Path) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"this machine's hard limit ({hard}) leaves nothing to raise")
    router = start_router(tmp_path, open_files=(256, None))
    try:
        soft, hard_seen = soft_and_hard_open_files(router.process.pid)
        assert soft == hard_seen
        assert soft != "256"
    finally:
        router.stop()
