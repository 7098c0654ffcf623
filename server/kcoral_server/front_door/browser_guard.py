"""Web pages must not drive a KCoral server or router (EXTENSIONS §6, "Browsers").

Who can reach what: a *web page* the user merely visits can make the browser send a "simple"
cross-site request (a multipart ``POST /execute`` needs no CORS preflight) to
``http://127.0.0.1:PORT``, and with DNS rebinding (the page's own name re-pointed at
127.0.0.1) it can read the answer too. Two checks close both doors, before authentication,
on every endpoint (``/health`` included):

* **Origin.** Browsers put ``Origin`` on cross-site requests (and on every ``POST``);
  KCoral's clients, the Jupyter server extension and the router tunnel never send one. A
  request whose ``Origin`` is present and not allow-listed (``--allowed-origin``) is refused.
  ``Origin: null`` (sandboxed iframes, ``file:`` pages) counts as present and cannot be
  allow-listed.
* **Host.** A rebound page still sends its *own* name in ``Host``. On a server or router
  that needs no client token (the only kind a rebound page can use), ``Host`` must be a
  loopback name or address, the address the process listens on, or allow-listed
  (``--allowed-host``). Loopback names are exactly ``localhost`` (not ``*.localhost``:
  allow those explicitly). On a wildcard listen address (``0.0.0.0``, ``::``) any IP literal
  passes: a page can only rebind a *name*, never an address. A token-protected process skips
  this check: a rebound page cannot know the token.
* **Fetch metadata.** A page's ``GET`` through a ``<script>``, ``<img>``, ``<link>`` or
  ``<iframe>`` carries no ``Origin`` and the right ``Host``, so the two checks above let it
  through: it ran the endpoint, a ``<script src=/v1/jobs>`` ran the job list as a script, an
  ``<iframe>`` showed any answer inside the page (Chromium, tested). Browsers mark where a
  request comes from (``Sec-Fetch-Site``, sent to loopback and HTTPS addresses); a request
  marked ``cross-site`` or ``same-site`` (another port of the same host: another site's page
  or a local program's) is refused unless it carries an allow-listed ``Origin``, but for a
  top-level navigation (a link the user follows: the page cannot read it). KCoral's clients
  send no ``Sec-Fetch-Site``; a page the user opens by typing its address sends ``none``.
  Every answer also says ``X-Content-Type-Options: nosniff`` and may not be framed
  (``BROWSER_HEADERS``), for browsers that send no fetch metadata (plain ``http`` off
  loopback).

Standard library only: ``kcoral_server.settings.config`` validates the allow-lists through this
module.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

ORIGIN_FLAG = "--allowed-origin"
HOST_FLAG = "--allowed-host"
LOOPBACK_NAMES = frozenset({"localhost"})
#: ``Sec-Fetch-Site`` values of a request a page of another origin's made
FOREIGN_SITES = frozenset({"cross-site", "same-site"})
#: ``Sec-Fetch-Dest`` of a top-level navigation (not a frame): its answer is the browser's
#: own page, which no other page reads or overlays
TOP_LEVEL_DESTINATION = "document"
#: Set on every answer of a server or router: no browser runs an answer as a script or
#: style (``nosniff``) or shows it inside another page (clickjacking, ``frame-ancestors``
#: and the older ``X-Frame-Options``).
BROWSER_HEADERS = (
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'"),
)
WILDCARD_ADDRESSES = frozenset({"", "0.0.0.0", "::"})
_ECHO_LIMIT = 100  # refused values are echoed so the operator knows what to allow; briefly


class HeaderList(Protocol):
    """Tornado's ``HTTPHeaders`` (or anything else that lists a header's values)."""

    def get_list(self, name: str) -> list[str]: ...


def normalize_origin(value: str) -> str:
    """``scheme://host[:port]`` lower-cased, without a trailing slash (as browsers send it)."""
    return value.strip().rstrip("/").lower()


def origin_problem(value: object) -> str | None:
    """Why ``value`` cannot be an ``--allowed-origin`` entry, or None."""
    if not isinstance(value, str) or not value.strip():
        return "must be a non-empty origin such as https://lab.example.org"
    text = normalize_origin(value)
    if text in ("null", "*"):
        return f"must name one origin ({value!r} would let any page in)"
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        return f"is not a valid origin ({exc})"
    if not parts.scheme or not parts.hostname or text != f"{parts.scheme}://{parts.netloc}":
        return f"must be scheme://host[:port] without a path (got {value!r})"
    return None


def normalize_host(value: str) -> str:
    """A ``Host`` value or allow-list entry without its port, brackets or final dot."""
    text = value.strip().lower()
    if text.startswith("["):  # [v6] or [v6]:port
        return text[1 : text.find("]")] if "]" in text else text
    if text.count(":") == 1:  # name:port or v4:port (a bare v6 address has several colons)
        text = text.split(":", 1)[0]
    return text[:-1] if text.endswith(".") else text


def host_problem(value: object) -> str | None:
    """Why ``value`` cannot be an ``--allowed-host`` entry, or None."""
    if not isinstance(value, str) or not value.strip():
        return "must be a non-empty host name"
    if any(c in value for c in "/@ \t*") or value.strip() != value:
        return f"must be a bare host name or address, without scheme, path or wildcard ({value!r})"
    name = normalize_host(value)
    if ":" in name and not _is_ip(name):
        return f"must be a host name without a port ({value!r})"
    if not name:
        return "must be a non-empty host name"
    return None


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _is_loopback(name: str) -> bool:
    if name in LOOPBACK_NAMES:
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


#: What a page's request was for, in words, by its ``Sec-Fetch-Dest`` (Fetch standard's
#: destinations; ``empty`` is a ``fetch()`` or ``XMLHttpRequest``); another value is echoed.
_DESTINATION_WORDS = {
    "empty": "a fetch",
    "script": "a script",
    "style": "a style sheet",
    "image": "an image",
    "iframe": "a frame",
    "frame": "a frame",
    "object": "an embedded object",
    "embed": "an embedded object",
    "worker": "a worker script",
    "sharedworker": "a worker script",
    "serviceworker": "a worker script",
    "font": "a font",
    "audio": "a media file",
    "video": "a media file",
    "track": "a media file",
    "document": "a page",
}


def _what_was_asked(destinations: list[str]) -> str:
    if len(destinations) != 1:
        return "a request"
    words = _DESTINATION_WORDS.get(destinations[0])
    return words + " request" if words else f"a {_echo(destinations[0])} request"


def _echo(value: str) -> str:
    return repr(value if len(value) <= _ECHO_LIMIT else value[:_ECHO_LIMIT] + "...")


@dataclass(frozen=True)
class BrowserGuard:
    """The two checks of one process; build it with ``BrowserGuard.build``."""

    allowed_origins: frozenset[str]
    allowed_hosts: frozenset[str]
    listen_host: str
    check_host: bool  # False when every request needs a client token
    process: str = "server"  # what the Host refusal calls this process: server or router

    @classmethod
    def build(
        cls,
        allowed_origins: Iterable[str] = (),
        allowed_hosts: Iterable[str] = (),
        listen_host: str = "127.0.0.1",
        *,
        token_required: bool,
        process: str = "server",
    ) -> BrowserGuard:
        return cls(
            allowed_origins=frozenset(normalize_origin(o) for o in allowed_origins),
            allowed_hosts=frozenset(normalize_host(h) for h in allowed_hosts),
            listen_host=normalize_host(listen_host),
            check_host=not token_required,
            process=process,
        )

    def host_allowed(self, value: str) -> bool:
        """Whether a ``Host`` header value names this process (port ignored)."""
        name = normalize_host(value)
        if _is_loopback(name) or name in self.allowed_hosts or name == self.listen_host:
            return True
        # A wildcard listener answers on every address of the machine; an IP literal in
        # Host cannot come from DNS rebinding, which needs a name the attacker controls.
        return self.listen_host in WILDCARD_ADDRESSES and _is_ip(name)

    def _own_url(self, host: str) -> str:
        """``http://ADDRESS:PORT`` with the address this process listens on (the port of
        ``host``, the Host header's value)."""
        address = self.listen_host
        if ":" in address:
            address = f"[{address}]"
        head, colon, port = host.strip().rpartition(":")
        if colon and port.isdigit() and (not head.startswith("[") or head.endswith("]")):
            return f"http://{address}:{port}"
        return f"http://{address}"

    def refusal(self, headers: HeaderList) -> str | None:
        """The 403 ``forbidden`` message for this request, or None when it may go on."""
        for origin in headers.get_list("Origin"):
            if normalize_origin(origin) == "null":  # sandboxed iframes, file: pages
                return "requests from web pages are refused: Origin 'null' is never allowed"
            if normalize_origin(origin) not in self.allowed_origins:
                return (
                    f"requests from web pages are refused: Origin {_echo(origin)} is not "
                    f"allowed (the operator can allow it with {ORIGIN_FLAG})"
                )
        site_refusal = self._fetch_site_refusal(headers)
        if site_refusal is not None:
            return site_refusal
        if self.check_host:
            for host in headers.get_list("Host"):
                if not self.host_allowed(host) and normalize_host(host) in ("0.0.0.0", "::"):
                    # a client given the listen-all address (`--host 0.0.0.0` in its URL):
                    # no page, and --allowed-host was the wrong advice
                    return (
                        f"Host {_echo(host)} is a listen-all address, not one to connect to: "
                        f"use this {self.process}'s own, {self._own_url(host)}"
                    )
                if not self.host_allowed(host):
                    return (
                        f"Host {_echo(host)} is not this {self.process}'s address (a DNS rebinding "
                        f"page?); the operator can allow it with {HOST_FLAG}"
                    )
        return None

    def _fetch_site_refusal(self, headers: HeaderList) -> str | None:
        """The refusal of a request a page of another site made without an allow-listed
        ``Origin`` (a script, image, style or frame), or None. Runs after the ``Origin``
        check: an ``Origin`` still present here is allow-listed."""
        sites = [value.strip().lower() for value in headers.get_list("Sec-Fetch-Site")]
        foreign = [site for site in sites if site in FOREIGN_SITES]
        if not foreign or headers.get_list("Origin"):
            return None
        destinations = [value.strip().lower() for value in headers.get_list("Sec-Fetch-Dest")]
        modes = [value.strip().lower() for value in headers.get_list("Sec-Fetch-Mode")]
        if destinations == [TOP_LEVEL_DESTINATION] and modes == ["navigate"]:
            return None  # a link the user follows: shown as the browser's own page
        return (
            f"requests from web pages are refused: {_what_was_asked(destinations)} from a page "
            f"of another origin (Sec-Fetch-Site {_echo(foreign[0])})"
        )
