"""The default bound on what the client reads: half the memory available, at most 64 GiB
(``kcoral.connection.answer_size``, EXTENSIONS §17), read from ``/proc/meminfo`` when a
body starts; a real stand-in server declares the answers."""

from __future__ import annotations

import asyncio
import http.server
from pathlib import Path

import pytest
from stand_in_http import serving

from kcoral import AsyncClient, Client
from kcoral.connection import answer_size
from kcoral.connection.answer_size import DEFAULT_ANSWER_CAP_BYTES, answer_limit
from kcoral.errors import TransportError

GIB = 1 << 30


def meminfo_saying(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, available_kib: int) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {4 * available_kib} kB\nMemAvailable: {available_kib} kB\n")
    monkeypatch.setattr(answer_size, "_MEMINFO", str(meminfo))
    monkeypatch.delenv("KCORAL_MAX_ANSWER_BYTES", raising=False)  # the machine's bound


class _Declaring(http.server.BaseHTTPRequestHandler):
    """Declares a 1.5 GiB answer and sends none of it: the client must not wait for it."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(3 * GIB // 2))
        self.end_headers()
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


def test_the_default_bound_is_half_the_memory_available(tmp_path, monkeypatch) -> None:
    meminfo_saying(tmp_path, monkeypatch, 2 * GIB >> 10)
    assert answer_limit(None) == (GIB, "half the memory available here")


def test_the_default_bound_is_the_cap_where_the_machine_says_nothing(monkeypatch) -> None:
    monkeypatch.setattr(answer_size, "_MEMINFO", "/nonexistent/meminfo")
    assert answer_limit(None) == (DEFAULT_ANSWER_CAP_BYTES, "its default cap")


def test_a_named_bound_is_the_bound_whatever_the_memory(tmp_path, monkeypatch) -> None:
    meminfo_saying(tmp_path, monkeypatch, 1024)
    assert answer_limit(5 * GIB) == (5 * GIB, "its max_answer_bytes")


def test_a_client_refuses_an_answer_over_half_the_memory_available(tmp_path, monkeypatch) -> None:
    meminfo_saying(tmp_path, monkeypatch, 2 * GIB >> 10)
    with serving(_Declaring) as url, pytest.raises(TransportError) as refused:
        Client(url).info()
    assert str(refused.value) == (
        f"{url} answered, but its answer is 1.5 GiB, more than the 1.0 GiB this client reads "
        "(half the memory available here): pass max_answer_bytes= to the client, or set "
        "KCORAL_MAX_ANSWER_BYTES, to read more"
    )


def test_an_async_client_refuses_an_answer_over_its_max_answer_bytes() -> None:
    async def ask(url: str) -> None:
        async with AsyncClient(url, max_answer_bytes=GIB) as client:
            await client.info()

    with serving(_Declaring) as url, pytest.raises(TransportError) as refused:
        asyncio.run(ask(url))
    assert "its answer is 1.5 GiB, more than the 1.0 GiB this client reads" in str(refused.value)


@pytest.mark.parametrize("bound", [0, -1, True, 1.5, "1G"])
def test_a_max_answer_bytes_that_is_no_positive_int_is_refused_at_construction(bound) -> None:
    with pytest.raises((TypeError, ValueError), match="max_answer_bytes must be"):
        Client("http://127.0.0.1:1", max_answer_bytes=bound)


def test_kcoral_max_answer_bytes_bounds_a_client_built_without_one(monkeypatch) -> None:
    """A notebook's ``%kcoral`` builds its own client: the environment sets its bound."""
    monkeypatch.setenv("KCORAL_MAX_ANSWER_BYTES", str(GIB))
    with serving(_Declaring) as url, pytest.raises(TransportError) as refused:
        Client(url).info()
    assert "more than the 1.0 GiB this client reads (its max_answer_bytes)" in str(refused.value)


@pytest.mark.parametrize("text", ["0", "1G", "-5"])
def test_a_kcoral_max_answer_bytes_that_is_no_positive_int_is_refused_in_its_name(
    monkeypatch, text
) -> None:
    monkeypatch.setenv("KCORAL_MAX_ANSWER_BYTES", text)
    with pytest.raises(ValueError, match=r"^KCORAL_MAX_ANSWER_BYTES must be"):
        Client("http://127.0.0.1:1")
