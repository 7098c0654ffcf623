"""What the panel says when a KCoral server cannot be asked: one line, in words.

The server extension calls each server with Tornado's HTTP client; what fails there
(``ConnectionRefusedError: [Errno 111] Connection refused``, ``HTTP 599: Timeout while
connecting``, ``[Errno -2] Name or service not known``) or what the server refuses (401)
is turned here into a sentence a person can act on. The panel shows it as it comes. So is
an answer the extension will not pass on (a redirect, an answer without a body) and a
configured address that is no server address.
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


def unusable_answer(status: int, location: str | None) -> str | None:
    """Why an answer of a KCoral server is not passed on, as one line; None for one that is.

    A redirect is never followed: a configured server could otherwise send the extension's
    calls, the user's Cancel included, to any address the Jupyter host reaches. An answer
    that has no body (1xx, 204, 304) cannot be relayed as the JSON the panel reads."""
    if status < 200 or status in (204, 304):
        return f"answered HTTP {status} without a body; a KCoral server answers with JSON"
    if 300 <= status < 400:
        where = " ".join((location or "").split())[:MESSAGE_CHARACTERS] or "nowhere"
        return (
            f"answered a redirect to {where} (HTTP {status}); KCoral servers do not redirect, "
            "so it was not followed"
        )
    return None


def address_problem(exc: BaseException, where: str) -> str:
    """Why a configured server address (``where``: the setting that holds it) is not used."""
    text = " ".join(str(exc).split())[:MESSAGE_CHARACTERS] or type(exc).__name__
    return f"not a server address: {text} (fix {where})"
