"""The synchronous ``Client`` (CLIENT_API.md §2, EXTENSIONS.md §1, §6, §9).

``execute`` runs the cache negotiation of PROTOCOL.md §9.3 (``kcoral.negotiation``, shared
with ``AsyncClient``): the program JSON is serialized once; first no blobs, then exactly
the missing ones, then all; a third ``CACHE_MISS`` is a ``ProtocolError``. No other
retries.
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import kcoral
from kcoral.http import HttpTransport
from kcoral.negotiation import ExecuteNegotiation
from kcoral.program import Program
from kcoral.response import decode_health, decode_json_object, decode_target, error_from_response
from kcoral.results import ProgramResult


class Client:
    """Talks to one KCoral server or router. Construction never contacts it."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        connect_timeout_seconds: float = 10.0,
        token: str | None = None,
    ) -> None:
        if not isinstance(base_url, str):
            raise TypeError(f"base_url must be a str, not {type(base_url).__name__}")
        url = base_url.rstrip("/")
        if not url.lower().startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if (
            isinstance(connect_timeout_seconds, bool)
            or not isinstance(connect_timeout_seconds, (int, float))
            or not math.isfinite(connect_timeout_seconds)
            or connect_timeout_seconds <= 0
        ):
            raise ValueError("connect_timeout_seconds must be a finite number > 0")
        extra = dict(headers or {})
        for name, value in extra.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise TypeError("headers must map str to str")
        if token is None:
            token = os.environ.get("KCORAL_TOKEN") or None
        if token is not None and not isinstance(token, str):
            raise TypeError("token must be a str")

        request_headers = {"User-Agent": f"kcoral/{kcoral.__version__}", **extra}
        if token:
            request_headers["Authorization"] = f"Bearer {token}"
        self.base_url = url
        self._transport = HttpTransport(
            url, headers=request_headers, connect_timeout_seconds=float(connect_timeout_seconds)
        )
        self._info: dict[str, Any] | None = None

    def __repr__(self) -> str:
        # Never show headers: they may carry the token.
        return f"Client({self.base_url!r})"

    def close(self) -> None:
        """Release pooled connections; returned results stay usable."""
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- read-only endpoints -------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``GET /health`` as a dict (``status == "ok"`` guaranteed)."""
        response = self._transport.request("GET", "/health")
        if response.status != 200:
            raise error_from_response(response.status, response.headers, response.data)
        return decode_health(response.data)

    def target(self) -> dict[str, str]:
        """The server's GPU target (``{"arch": "sm_90a"}``); ``ProtocolError`` on CPU servers."""
        return decode_target(self.health())

    def info(self) -> dict[str, Any]:
        """``GET /v1/info`` (EXTENSIONS.md §1), read once per client and cached.

        Warns once (``UserWarning``) when the server's major.minor version differs.
        """
        if self._info is None:
            response = self._transport.request("GET", "/v1/info")
            if response.status != 200:
                raise error_from_response(response.status, response.headers, response.data)
            info = decode_json_object(response.data, "/v1/info response")
            server_version = info.get("kcoral")
            if isinstance(server_version, str) and _major_minor(server_version) != _major_minor(
                kcoral.__version__
            ):
                warnings.warn(
                    f"KCoral server version {server_version} differs from client version "
                    f"{kcoral.__version__}",
                    UserWarning,
                    stacklevel=2,
                )
            self._info = info
        return copy.deepcopy(self._info)

    # -- execution -----------------------------------------------------------------------

    def execute(
        self,
        program: Program,
        *,
        timeout_seconds: float | None = None,
        output_limit_bytes: int | None = None,
        gpu_count: int | None = None,
    ) -> ProgramResult:
        """Run ``program`` once; ``FAILED`` programs are returned, not raised."""
        negotiation = ExecuteNegotiation(
            program,
            timeout_seconds=timeout_seconds,
            output_limit_bytes=output_limit_bytes,
            gpu_count=gpu_count,
        )
        return self.run_negotiation(negotiation)

    def run_negotiation(self, negotiation: ExecuteNegotiation) -> ProgramResult:
        """Drive one prepared ``/execute`` negotiation (used by remote functions, which add
        their serialization header) until it yields a result or raises."""
        attempt = negotiation.first_attempt()
        while True:
            response = self._transport.request(
                "POST",
                "/execute",
                body=attempt.chunks,
                content_length=attempt.length,
                headers=attempt.headers,
            )
            outcome = negotiation.handle_response(
                response.status,
                response.headers,
                response.headers.get("Content-Type"),
                response.data,
            )
            if isinstance(outcome, ProgramResult):
                return outcome
            attempt = outcome

    # -- remote functions ----------------------------------------------------------------

    def function(
        self,
        *,
        timeout: float | None = None,
        output_limit_bytes: int | None = None,
        cpu_only: bool = False,
        **options: Any,
    ) -> Callable[[Callable[..., Any]], Any]:
        """Decorator returning a ``RemoteFunction`` bound to this client (CLIENT_API §8)."""
        from kcoral.remote import RemoteFunction

        def decorate(fn: Callable[..., Any]) -> Any:
            return RemoteFunction(
                fn,
                client=self,
                timeout=timeout,
                output_limit_bytes=output_limit_bytes,
                cpu_only=cpu_only,
                **options,
            )

        return decorate


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:2])
