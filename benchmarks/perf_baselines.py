"""Baselines of ``perf.py``: this machine's raw speeds, measured in the same run.

* ``describe_machine`` — CPU, cores, memory, load, Python and library versions.
* ``loopback_tcp_seconds_per_byte`` — raw TCP over 127.0.0.1 between two processes.
* ``sha256_seconds_per_byte`` / ``memcpy_seconds_per_byte`` — hashing and copying speed.
* ``python_startup_seconds`` — a bare ``python -c pass``.
* ``echo_server`` + ``echo_round_trips`` — a bare Tornado POST echo driven by the same
  urllib3 transport (``kcoral.connection.http.HttpTransport``) that ``kcoral.Client`` uses.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from kcoral.connection.http import HttpTransport

HERE = Path(__file__).resolve().parent

_SENDER = """
import socket, sys
port, size, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
data = memoryview(bytearray(size))
sock = socket.create_connection(("127.0.0.1", port))
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range(reps):
    if sock.recv(1) != b"g":
        break
    sock.sendall(data)
sock.close()
"""


def describe_machine() -> dict[str, object]:
    """What the numbers were measured on (versions read without importing torch)."""
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for name in ("kcoral", "tornado", "urllib3", "numpy", "torch", "psutil"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "cpu_model": model,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_bytes": psutil.virtual_memory().total,
        "load_average": list(os.getloadavg()),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "openssl": ssl.OPENSSL_VERSION,
        "versions": versions,
    }


def loopback_tcp_seconds_per_byte(size: int, reps: int) -> float:
    """Median seconds per byte of one ``size``-byte transfer over loopback TCP.

    The sender is another process (as the client is for the server); the receiver reads
    into a preallocated buffer, so this is the best the kernel's loopback can do.
    """
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    sender = subprocess.Popen([sys.executable, "-c", _SENDER, str(port), str(size), str(reps)])
    samples = []
    try:
        listener.settimeout(60)
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffer = memoryview(bytearray(size))
        with conn:
            for _ in range(reps):
                start = time.perf_counter()
                conn.sendall(b"g")
                received = 0
                while received < size:
                    n = conn.recv_into(buffer[received:])
                    if n == 0:
                        raise RuntimeError("the TCP sender stopped early")
                    received += n
                samples.append(time.perf_counter() - start)
    finally:
        listener.close()
        sender.wait(timeout=60)
    return statistics.median(samples) / size


def sha256_seconds_per_byte(size: int, reps: int) -> float:
    data = memoryview(os.urandom(min(size, 1 << 20)) * max(1, size // (1 << 20)))
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        hashlib.sha256(data).digest()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) / len(data)


def memcpy_seconds_per_byte(size: int, reps: int) -> float:
    source = bytearray(size)
    target = bytearray(size)
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        target[:] = source
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) / size


def python_startup_seconds(reps: int) -> float:
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


@contextmanager
def echo_server() -> Iterator[str]:
    """Run ``perf_echo_server.py`` in a subprocess; yields its URL."""
    with tempfile.TemporaryDirectory(prefix="kcoral-perf-echo-") as base:
        ready = Path(base) / "ready"
        process = subprocess.Popen([sys.executable, str(HERE / "perf_echo_server.py"), str(ready)])
        try:
            deadline = time.monotonic() + 30
            while not (ready.exists() and ready.read_text().strip()):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the echo server did not start")
                time.sleep(0.02)
            yield ready.read_text().strip()
        finally:
            process.terminate()
            process.wait(timeout=30)


def echo_round_trips(url: str, body_size: int, samples: int) -> list[float]:
    """Seconds per POST /echo of ``body_size`` bytes with the client's own transport."""
    transport = HttpTransport(
        url, headers={"User-Agent": "kcoral-perf"}, connect_timeout_seconds=10
    )
    body = b"x" * body_size
    times = []
    try:
        for i in range(samples + 3):  # 3 warm-up requests open the keep-alive connection
            start = time.perf_counter()
            response = transport.request(
                "POST",
                "/echo",
                body=[body],
                content_length=len(body),
                headers={"Content-Type": "application/octet-stream"},
            )
            elapsed = time.perf_counter() - start
            if response.status != 200 or len(response.data) != body_size:
                raise RuntimeError(f"echo answered {response.status}")
            if i >= 3:
                times.append(elapsed)
    finally:
        transport.close()
    return times
