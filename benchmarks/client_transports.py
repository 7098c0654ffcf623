"""Candidate HTTP stacks of the client, against a running KCoral server.

    python benchmarks/client_transports.py URL STACK TASK [COUNT]

STACK: ``urllib3`` (``Client``'s transport), ``urllib3-threads`` (the same transport awaited
from asyncio, ``AsyncClient``'s default), ``tornado`` (``AsyncHTTPClient``, the earlier
``AsyncClient``), ``httpx`` and ``httpx-async``. TASK: ``trivial`` (COUNT ``GET /health``,
one at a time on one kept-alive connection; prints microseconds per request) or ``upload``
(one ``POST /execute`` of a program with a 64 MiB bytes upload sent in the body, as the
client's third negotiation attempt does; prints seconds). Each run is one process, so a
whole-process timer (``/usr/bin/time -v``) also gives its peak memory; ``import`` prints the
time to import the stack alone. Used to choose the base install's dependencies
(CLIENT_API §1); the numbers are in that section's note, not in any test.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any

UPLOAD_BYTES = 64 << 20


def upload_request() -> tuple[dict[str, str], list[bytes | memoryview], int]:
    """The body of a negotiation's all-blobs attempt: the program JSON, then the blob."""
    from kcoral import Program
    from kcoral.connection.negotiation import execute_body
    from kcoral.protocol.multipart import encode_multipart

    program = Program()
    program.upload(kind="bytes", value=bytes(UPLOAD_BYTES), id="blob")
    parts: list[tuple[str, str, bytes | memoryview]] = [
        ("program", "application/json", execute_body(program))
    ]
    parts += [(f"blob:{d}", "application/octet-stream", v) for d, v in program.blobs.items()]
    content_type, chunks, length = encode_multipart(parts)
    return {"Content-Type": content_type}, chunks, length


def sync_stack(name: str, url: str) -> Callable[[str, str, Any], int]:
    if name == "urllib3":
        from kcoral.connection.http import HttpTransport
        from kcoral.connection.transport import Request

        transport = HttpTransport(url, headers={}, connect_timeout_seconds=10)

        def send(method: str, path: str, body: Any) -> int:
            headers, chunks, length = body or ({}, None, 0)
            return transport.handle_request(Request(method, path, headers, chunks, length)).status

        return send
    import httpx

    client = httpx.Client(base_url=url, timeout=httpx.Timeout(None, connect=10))

    def send_httpx(method: str, path: str, body: Any) -> int:
        if body is None:
            return client.request(method, path).status_code
        headers, chunks, length = body
        headers = {**headers, "Content-Length": str(length)}
        return client.request(method, path, headers=headers, content=iter(chunks)).status_code

    return send_httpx


def async_stack(name: str, url: str) -> Callable[[str, str, Any], Any]:
    if name == "urllib3-threads":
        from kcoral.connection.http import HttpTransport
        from kcoral.connection.transport import Request, ThreadedAsyncTransport

        transport = ThreadedAsyncTransport(
            HttpTransport(url, headers={}, connect_timeout_seconds=10), max_workers=64
        )

        async def send(method: str, path: str, body: Any) -> int:
            headers, chunks, length = body or ({}, None, 0)
            request = Request(method, path, headers, chunks, length)
            return (await transport.handle_async_request(request)).status

        return send
    if name == "tornado":
        from tornado.httpclient import AsyncHTTPClient, HTTPRequest

        http = AsyncHTTPClient(force_instance=True, max_body_size=1 << 40)

        async def send_tornado(method: str, path: str, body: Any) -> int:
            producer = None
            headers: dict[str, str] = {}
            if body is not None:
                headers, chunks, length = body
                headers = {**headers, "Content-Length": str(length)}

                async def producer(write: Any) -> None:
                    for chunk in chunks:
                        await write(chunk)

            request = HTTPRequest(
                url + path,
                method=method,
                headers=headers,
                body_producer=producer,
                request_timeout=0,
            )
            return (await http.fetch(request, raise_error=False)).code

        return send_tornado
    import httpx

    client = httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(None, connect=10))

    async def send_httpx(method: str, path: str, body: Any) -> int:
        if body is None:
            return (await client.request(method, path)).status_code
        headers, chunks, length = body
        headers = {**headers, "Content-Length": str(length)}

        async def content() -> Any:
            for chunk in chunks:
                yield chunk

        return (await client.request(method, path, headers=headers, content=content())).status_code

    return send_httpx


def main() -> None:
    if len(sys.argv) not in (4, 5) or sys.argv[1].startswith("-"):
        sys.exit("usage: python benchmarks/client_transports.py URL STACK TASK [COUNT]")
    url, stack, task = sys.argv[1:4]
    count = int(sys.argv[4]) if len(sys.argv) > 4 else 2000
    started = time.perf_counter()
    is_async = stack in ("urllib3-threads", "tornado", "httpx-async")
    if task == "import":
        __import__({"urllib3-threads": "urllib3", "httpx-async": "httpx"}.get(stack, stack))
        print(f"{stack} import: {(time.perf_counter() - started) * 1000:.1f} ms")
        return
    body = upload_request() if task == "upload" else None
    path = "/execute" if task == "upload" else "/health"
    rounds = 1 if task == "upload" else count
    if is_async:

        async def run() -> list[int]:
            send = async_stack(stack, url)
            await send("GET", "/health", None)  # connect before timing
            began = time.perf_counter()
            codes = [await send("POST" if body else "GET", path, body) for _ in range(rounds)]
            return [*codes, began]  # type: ignore[list-item]

        *codes, began = asyncio.run(run())
    else:
        send = sync_stack(stack, url)
        send("GET", "/health", None)
        began = time.perf_counter()
        codes = [send("POST" if body else "GET", path, body) for _ in range(rounds)]
    elapsed = time.perf_counter() - began
    assert set(codes) == {200}, set(codes)
    if task == "upload":
        print(f"{stack} upload 64 MiB: {elapsed:.3f} s")
    else:
        print(f"{stack} trivial: {elapsed / rounds * 1e6:.0f} us/request")


if __name__ == "__main__":
    main()
