"""What the panel says when a KCoral server cannot be asked: one line, in words.

The server extension calls each server with Tornado's HTTP client; what fails there
(``ConnectionRefusedError: [Errno 111] Connection refused``, ``HTTP 599: Timeout while
connecting``, ``[Errno -2] Name or service not known``) or what the server refuses (401)
is turned here into a sentence a person can act on. The panel shows it as it comes.
"""

from __future__ import annotations

import errno
import socket
import ssl
from typing import Any
from urllib.parse import urlsplit

from tornado.httpclient import HTTPClientError

MESSAGE_CHARACTERS = 200


def _where(url: str) -> str:
    try:
        parts = urlsplit(url)
        return parts.netloc or url
    except ValueError:
        return url


def transport_problem(exc: BaseException, url: str, timeout_seconds: float) -> str:
    """Why a call to ``url`` got no answer, as one line."""
    where = _where(url)
    if isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) in (
        errno.ECONNREFUSED,
    ):
        return f"not running: nothing answers at {where}"
    if isinstance(exc, socket.gaierror):
        host = urlsplit(url).hostname or where
        return f"unknown host: the name {host} does not resolve"
    if isinstance(exc, ssl.SSLError):
        return f"the secure connection to {where} failed ({exc.reason or 'TLS error'})"
    if isinstance(exc, HTTPClientError) and exc.code == 599 and "Timeout" in str(exc):
        return f"no answer from {where} within {timeout_seconds:g} s"
    if isinstance(exc, TimeoutError):
        return f"no answer from {where} within {timeout_seconds:g} s"
    if isinstance(exc, (ConnectionResetError, BrokenPipeError)):
        return f"{where} closed the connection before answering"
    if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return f"{where} cannot be reached from here (no route)"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"cannot reach {where}: {text[:MESSAGE_CHARACTERS]}"


def refusal_problem(status: int, document: Any, has_token: bool) -> str:
    """Why a server answered a status other than 200, as one line."""
    message = ""
    if isinstance(document, dict) and isinstance(document.get("error"), dict):
        given = document["error"].get("message")
        if isinstance(given, str):
            message = " ".join(given.split())[:MESSAGE_CHARACTERS]
    if status == 401:
        if has_token:
            return "refused the token configured for it (HTTP 401)"
        return "needs a token: set one for this server (HTTP 401)"
    if status == 403:
        return f"refused this request (HTTP 403{': ' + message if message else ''})"
    if status == 404:
        return "is not a KCoral server, or not this version (HTTP 404)"
    if status == 503:
        return f"is busy or starting (HTTP 503{': ' + message if message else ''})"
    return f"answered HTTP {status}{': ' + message if message else ''}"
