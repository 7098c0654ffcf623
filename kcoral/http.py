"""The synchronous HTTP transport of ``Client`` (urllib3, keep-alive pool, no retries).

urllib3 needs no event loop, so the sync client also works in a thread that already runs
one (a Jupyter kernel). Only connecting is bounded by a timeout; reading never times out
because the server enforces execution deadlines itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3

from kcoral.errors import TransportError


@dataclass(frozen=True)
class HttpResponse:
    """A fully read answer; ``headers`` is case-insensitive."""

    status: int
    headers: Mapping[str, str]
    data: bytes


class HttpTransport:
    """One keep-alive connection pool towards one origin."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str],
        connect_timeout_seconds: float,
    ) -> None:
        self.base_url = base_url
        self._headers = dict(headers)
        self._pool = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=connect_timeout_seconds, read=None),
            retries=False,
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Iterable[bytes | memoryview] | None = None,
        content_length: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> HttpResponse:
        """Send one request and read the whole answer.

        ``body`` chunks are streamed as given with an explicit ``Content-Length``. No answer
        -> ``TransportError``. ``KeyboardInterrupt`` closes the connection instead of
        returning it to the pool (the server then cancels the program) and propagates.
        """
        extra = dict(headers or {})
        overridden = {name.lower() for name in extra}
        # Per-request headers win, whatever their capitalization.
        all_headers = {k: v for k, v in self._headers.items() if k.lower() not in overridden}
        all_headers.update(extra)
        if body is not None:
            all_headers["Content-Length"] = str(content_length)
        response: Any = None
        try:
            response = self._pool.request(
                method,
                self.base_url + path,
                body=body,
                headers=all_headers,
                preload_content=False,
                redirect=False,
            )
            data = response.read()
            status = response.status
            response_headers = response.headers
            response.release_conn()
        except KeyboardInterrupt:
            # urllib3 closes the connection itself when interrupted before the answer
            # started; once it did, close it here so it never goes back to the pool.
            if response is not None:
                response.close()
            raise
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if response is not None:
                response.close()
            raise TransportError(f"{method} {self.base_url}{path} failed: {exc}") from exc
        return HttpResponse(status, response_headers, data)

    def close(self) -> None:
        """Drop every pooled connection; the transport stays usable (it reconnects)."""
        self._pool.clear()
