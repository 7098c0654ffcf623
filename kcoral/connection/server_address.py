"""What a server address may look like: the one rule (CLIENT_API §2) for every entry point.

``Client``/``AsyncClient`` (``base_url``), ``KCORAL_URL``, ``kcoral run --url``, the magics
(``%kcoral connect``, ``--url``, ``KCoral.url``) and the Jupyter server extension all ask
``server_url``, so an address that works in one works in all:

* with ``://`` it is a URL: ``http`` or ``https`` only, a host, no credentials, query,
  fragment or whitespace; a path is kept (a router behind a prefix);
* without ``://`` it is ``host:port`` and means ``http://host:port``; the port is required,
  so that ``localhost:8000`` is never read as a URL of scheme ``localhost``, and an IPv6
  address goes in brackets (``[::1]:8000``), as in a URL.

The answer has no trailing ``/``. Errors are ``ValueError`` naming what is wrong (callers
that speak to a user put their own prefix in front: ``--url``, ``KCORAL_URL``).
"""

from __future__ import annotations

import ipaddress
import urllib.parse

_SCHEMES = ("http", "https")
# Never part of a host name (RFC 3986 gen-delims and the characters a shell or a URL
# would read differently).
_NOT_IN_HOST = set("/:@?#\\[]%")


def server_url(address: object) -> str:
    """The base URL ``address`` names (``127.0.0.1:8000`` -> ``http://127.0.0.1:8000``).

    ``TypeError`` for a non-``str``, ``ValueError`` (with the reason) for anything else the
    rule does not allow."""
    if not isinstance(address, str):
        raise TypeError(f"a server address must be a str, not {type(address).__name__}")
    text = address.strip()
    if not text:
        raise ValueError("a server address is empty")
    if any(char.isspace() for char in text):
        raise ValueError(f"{address!r} must not contain whitespace")
    if "://" in text:
        return _checked_url(text)
    return "http://" + _host_port(text)


def _checked_url(text: str) -> str:
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError as exc:  # quoted with its secrets hidden all the same
        scheme, _, rest = text.partition("://")
        shown = f"{scheme}://{_hiding_secrets_in_host_port(rest)}"
        raise ValueError(f"{shown!r} is not a valid URL: {exc}") from None
    shown = _hiding_secrets(parts, text)
    host_part = parts.netloc.rsplit("@", 1)[-1]
    if not host_part.startswith("[") and host_part.count(":") > 1:
        raise ValueError(f"{shown!r}: an IPv6 address goes in brackets (http://[::1]:8000)")
    try:
        port = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError as exc:
        raise ValueError(f"{shown!r} is not a valid URL: {exc}") from None
    if parts.scheme.lower() not in _SCHEMES:
        raise ValueError(f"{shown!r}: a server URL starts with http:// or https://")
    if not parts.hostname:
        raise ValueError(f"{shown!r} has no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            f"{shown!r} must not contain credentials (a token goes in KCORAL_TOKEN, never "
            "the address)"
        )
    if parts.query or parts.fragment or "?" in text or "#" in text:
        raise ValueError(f"{shown!r} must not have a query or fragment")
    if port == 0:
        raise ValueError(f"{shown!r}: port 0 is not a server's port")
    return text.rstrip("/")


def _hiding_secrets(parts: urllib.parse.SplitResult, text: str) -> str:
    """The address with its credentials, query and fragment shown as ``***``: they are where
    a pasted token sits (``http://TOKEN@host:8000``, ``?token=...``), and the refusal is
    printed, in a notebook saved with it."""
    host = parts.netloc.rsplit("@", 1)[-1]
    netloc = f"***@{host}" if "@" in parts.netloc else host
    query = "?***" if "?" in text else ""
    fragment = "#***" if "#" in text else ""
    return f"{parts.scheme}://{netloc}{parts.path}{query}{fragment}"


def _host_port(text: str) -> str:
    """``host:port`` checked; the same text back (a bracketed IPv6 host kept as given)."""
    example = "host:port, e.g. 127.0.0.1:8000, or a URL such as http://host:8000"
    text = text.rstrip("/")
    quoted = _hiding_secrets_in_host_port(text)
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket:
            raise ValueError(f"{quoted!r}: an IPv6 address needs its closing bracket ([::1]:8000)")
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise ValueError(f"{quoted!r}: [{host}] is not an IPv6 address") from None
        if not rest.startswith(":"):
            raise ValueError(f"{quoted!r}: the port is required ({example})")
        port = rest[1:]
        shown = f"[{host}]"
    else:
        if text.count(":") > 1:
            raise ValueError(f"{quoted!r}: an IPv6 address goes in brackets ([::1]:8000)")
        host, colon, port = text.partition(":")
        if not colon:
            raise ValueError(f"{quoted!r}: the port is required ({example})")
        if not host or any(char in _NOT_IN_HOST for char in host):
            raise ValueError(f"{quoted!r} is not {example}")
        shown = host
    number, slash, path = port.partition("/")
    if slash and number.isascii() and number.isdigit():
        # `127.0.0.1:8000/v1` (a path pasted with the address) read "the port must be a
        # number", which it is; a URL takes no query or fragment either, so none is offered
        if "?" in path or "#" in path:
            raise ValueError(f"{quoted!r}: host:port takes no path: give {shown}:{number}")
        raise ValueError(
            f"{quoted!r}: host:port takes no path: give {shown}:{number}, or a URL "
            f"(http://{text}) where a proxy serves KCoral under that path"
        )
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ValueError(f"{quoted!r}: the port must be a number from 1 to 65535")
    return f"{shown}:{int(port)}"


def _hiding_secrets_in_host_port(text: str) -> str:
    """``host:port`` text as a refusal quotes it: what comes before an ``@`` and after a ``?``
    or ``#`` shown as ``***``, as ``_hiding_secrets`` does for a URL."""
    rest, fragment, _ = text.partition("#")
    rest, query, _ = rest.partition("?")
    if "@" in rest:
        rest = "***@" + rest.rsplit("@", 1)[1]
    return rest + ("?***" if query else "") + ("#***" if fragment else "")


def path_not_served_hint(url: str) -> str:
    """What to do when ``url``, with a path, got a 404 where every KCoral server answers
    (``/health``, ``/execute``, a job submission), else ``""``: a path pasted with the
    address (``http://host:8000/v1``) otherwise read only ``HTTP 404: not found``, or a hint
    about listing jobs. A path belongs in a server address only where a proxy serves KCoral
    under it (CLIENT_API §2)."""
    parts = urllib.parse.urlsplit(url)
    if parts.path.strip("/") == "":
        return ""
    return (
        f"no KCoral server answers under the path {parts.path}: give the server's own "
        f"address, {parts.scheme}://{parts.netloc} (a path only where a proxy serves it there)"
    )
