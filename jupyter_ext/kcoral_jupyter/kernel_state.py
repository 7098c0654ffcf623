"""Per-kernel state of the extension: settings, clients, the embedded server, known jobs,
and the KCoral session the kernel's cells run in (``notebook_session.SessionHolder``).

Called ``KernelState``, not a session: "session" names only KCoral sessions (EXTENSIONS §11).

No IPython import: the magics own the notebook side; this owns which server to talk to.

Tokens are per URL (EXTENSIONS §6): the user's token (``KCORAL_TOKEN`` /
``%config KCoral.token``) goes to the servers the user names (``KCORAL_URL``,
``%kcoral connect``, ``--url``), never to the embedded server, whose own fresh token goes
only to it. A server the user did not mean to trust thus never sees the user's token.
"""

from __future__ import annotations

import math
import platform
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kcoral import Client, KCoralError
from kcoral.base_client import bearer_token
from kcoral.connection.server_address import server_url
from kcoral.response import gpus_label
from kcoral_jupyter.cell_errors import (
    EmbeddedServerUnavailableError,
    LocalServerStartError,
    NotConnectedError,
    ServerAddressError,
    TokenSettingError,
)
from kcoral_jupyter.cell_program import BuiltCell
from kcoral_jupyter.local_server import LocalServer
from kcoral_jupyter.notebook_session import SessionHolder
from kcoral_jupyter.runner import server_features
from kcoral_jupyter.runtime_records import KernelConnection
from kcoral_jupyter.settings import KCoral

#: why a kernel's first local start happens, said once
NO_SERVER_CONFIGURED = "no server configured (KCORAL_URL, %kcoral connect URL); "

#: ``GET /v1/info`` answers meaning "this server has none" (PROTOCOL servers without it).
INFO_ABSENT_STATUSES = frozenset({404, 405})


@dataclass
class ServerFacts:
    """What a cell needs to know about a server, read once per client."""

    features: list[str]
    gpu_count: int
    target: dict[str, str]
    device: str
    sandbox: str = ""  # `bubblewrap`, `none`, or "" when the server does not say
    # A router's default kind (``/v1/info`` fleet, ROUTER §6): where a cell without
    # --select goes; None from a direct server.
    default_kind: str | None = None
    # A router (its /v1/info has ``fleet``, ROUTER §13): with --select the node is its
    # choice, so these facts (its default kind's) say nothing of the node that runs a cell.
    # A direct server is the node a selector is matched against (EXTENSIONS §14).
    router: bool = False

    @property
    def label(self) -> str:
        return gpus_label(self.gpu_count, self.target.get("arch"))


def default_kind(info: Mapping[str, Any]) -> str | None:
    """The GPU kind a router sends requests without a selector to (its ``fleet`` kind
    marked ``default``), or None."""
    fleet = info.get("fleet")
    kinds = fleet.get("kinds") if isinstance(fleet, Mapping) else None
    for kind in kinds if isinstance(kinds, list) else []:
        if isinstance(kind, Mapping) and kind.get("default") and isinstance(kind.get("gpu"), str):
            return str(kind["gpu"])
    return None


@dataclass
class PendingJob:
    """A ``--noblock`` job of this kernel: enough to bind its ``--out`` values later."""

    built: BuiltCell
    url: str
    warning: str | None = None  # "ran on CPU (this server has no GPU)" for an explicit --gpus
    bench_label: str | None = None  # --bench-label: its results are recorded on attach


@dataclass
class KernelState:
    """One kernel's state: which server its cells use, with which token, and what runs there."""

    settings: KCoral
    announce: Callable[[str], None] = print
    local: LocalServer | None = None
    _clients: dict[tuple[str, str], Client] = field(default_factory=dict)
    _facts: dict[str, ServerFacts] = field(default_factory=dict)
    pending: dict[str, PendingJob] = field(default_factory=dict)
    _announced_local: bool = False
    # Tells the Jupyter server extension which server this kernel's cells use, so the status
    # bar shows the one of the notebook in focus (a 0600 runtime record, runtime_records.py).
    connection: KernelConnection = field(default_factory=KernelConnection)
    _used_url: str | None = None
    # Set by a failed ``%kcoral connect`` (URL, reason): no cell runs anywhere, and none falls
    # back to the embedded server, until a connect succeeds or the user picks a server.
    failed_connect: tuple[str, str] | None = None
    # What fixes it where the server answered and refused (a 401's "%config KCoral.token"):
    # "again once it answers" would not, nor would the client's "set KCORAL_TOKEN".
    failed_connect_fix: str | None = None
    # ``%kcoral session``: the KCoral session the cells run in, if any.
    sessions: SessionHolder = field(default_factory=SessionHolder)
    # The URLs of this kernel's embedded servers that are gone (stopped, or exited): their
    # jobs ended with them, and the next local server (a new port) never had them.
    gone_local: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        # Choosing a server (%config KCoral.url = ...) ends the unconnected state.
        self.settings.observe(lambda _change: self.clear_failed_connect(), names="url")

    def resolve_url(self, explicit: str | None = None) -> str:
        """``--url``, else the configured URL, else the embedded server (started on demand).

        After a failed ``%kcoral connect`` only an explicit ``--url`` runs: silently running
        somewhere else (the embedded CPU server) is what the user must never get."""
        if explicit:
            return normalize_url(explicit)
        if self.failed_connect is not None:
            url, reason = self.failed_connect
            raise NotConnectedError(
                f"not connected: %kcoral connect {url} failed ({reason})",
                f"{self.failed_connect_fix}; then %kcoral connect again"
                if self.failed_connect_fix
                else f"run %kcoral connect {url} again once it answers, connect elsewhere, "
                "or %kcoral local start for a server on this machine",
            )
        if self.settings.url:
            url = normalize_url(self.settings.url)
        else:
            url = self.start_local()
        self.use(url)
        return url

    def running_url(self, explicit: str | None = None) -> str | None:
        """``resolve_url`` for what only reads a server (its jobs): None where it would
        start the embedded server, which would then have none to show."""
        local_running = self.local is not None and self.local.running
        if explicit or self.settings.url or self.failed_connect is not None or local_running:
            return self.resolve_url(explicit)
        return None

    def is_local(self, url: str) -> bool:
        """Is ``url`` this kernel's embedded server (its jobs end with the kernel)?"""
        return self.local is not None and self.local.url == url

    def local_gone(self, url: str) -> bool:
        """Was ``url`` one of this kernel's embedded servers that is no longer running?"""
        local = self.local
        exited = local is not None and local.url == url and not local.running
        return exited or url in self.gone_local

    def use(self, url: str) -> None:
        """Record that this kernel's cells now go to ``url`` (for the JupyterLab UI)."""
        if url != self._used_url:
            self._used_url = url
            embedded = self.local is not None and self.local.url == url
            self.connection.announce(url, self.token_for(url), embedded=embedded)

    @property
    def used_url(self) -> str | None:
        """The URL this kernel's cells last went to (None before the first, or after a stop)."""
        return self._used_url

    def connect_failed(self, url: str, reason: str, fix: str | None = None) -> None:
        """Leave the kernel unconnected after a failed ``%kcoral connect url``; ``fix``:
        what to do first, where the server answered and refused."""
        self.failed_connect = (url, reason)
        self.failed_connect_fix = fix
        if self._used_url is not None:
            self._used_url = None
            self.connection.withdraw()

    def clear_failed_connect(self) -> None:
        self.failed_connect = None
        self.failed_connect_fix = None

    def start_local(self, *, asked: bool = False) -> str:
        """Start the embedded server unless it runs; its URL. ``asked``: by ``%kcoral local
        start``, where "no server configured" was no reason and could be false."""
        if not embedded_server_supported():
            raise EmbeddedServerUnavailableError(
                f"no server configured, and the embedded KCoral server needs Linux (this "
                f"kernel runs on {platform_name()})",
                "connect to a Linux GPU server: %kcoral connect http://HOST:8123 (or set "
                "KCORAL_URL before starting Jupyter)",
            )
        timeout = self.settings.local_start_timeout
        if not (math.isfinite(timeout) and timeout > 0):
            raise LocalServerStartError(
                f"KCoral.local_start_timeout is {timeout:g}: the local KCoral server needs a "
                "positive number of seconds to start in",
                "%config KCoral.local_start_timeout = 120 (the default), then run it again",
            )
        self.clear_failed_connect()
        # The settings as they are now: a failed start with bad local_args is fixed by
        # fixing the setting, not by restarting the kernel.
        if self.local is None:
            self.local = LocalServer(self.settings.local_args, start_timeout=timeout)
        else:
            self.local.configure(self.settings.local_args, timeout)
        was_running = self.local.running
        if not was_running and self.local.url:
            self.gone_local.add(self.local.url)  # it exited on its own
        if not was_running:
            # Said before the start, which takes seconds (its workers, torch): said after
            # it, the first cell showed nothing for them (lab soak).
            why = "" if self._announced_local or asked else NO_SERVER_CONFIGURED
            self._announced_local = self._announced_local or not asked
            self.announce(f"kcoral: {why}starting a local server for this kernel's lifetime")
        url = self.local.start()
        self.gone_local.discard(url)  # a new server on a port an old one had
        if not was_running:
            self.announce(f"kcoral: local server running at {url}")
        return url

    def stop_local(self) -> bool:
        if self.local is None:
            return False
        url = self.local.url
        stopped = self.local.stop()
        if url:
            self.gone_local.add(url)
            self.forget(url)
            if url == self._used_url:
                self._used_url = None
                self.connection.withdraw()
        return stopped

    def token_for(self, url: str) -> str:
        """The bearer token for ``url`` ("" for none): the embedded server's own token for its
        URL, the user's token for every other URL."""
        local = self.local
        if local is not None and local.url is not None and url == local.url:
            return local.token or ""
        token = self.settings.token
        if token:
            try:
                bearer_token(token, "KCoral.token")
            except ValueError as exc:
                # The client's ValueError left the cell with a traceback through the
                # extension's frames (one pasted as 'Bearer ...' the likeliest).
                raise TokenSettingError(
                    str(exc),
                    "%config KCoral.token = '...' sets it (KCORAL_TOKEN is read only at the "
                    "extension's first use)",
                ) from None
        return token

    def client(self, url: str) -> Client:
        token = self.token_for(url)
        key = (url, token)
        client = self._clients.get(key)
        if client is None:
            client = Client(url, token=token or None)
            self._clients[key] = client
        return client

    def fresh_info(self, url: str) -> dict[str, Any]:
        """``/v1/info`` as ``url`` answers it now: a client reads it once and keeps it, but
        a router's fleet (seats, queue, estimated wait) changes by the second."""
        token = self.token_for(url)
        with Client(url, token=token or None) as client:
            return client.info()

    def facts(self, url: str) -> ServerFacts:
        facts = self._facts.get(url)
        if facts is None:
            client = self.client(url)
            health = client.health()
            info: dict[str, Any] = {}
            try:
                info = client.info()
            except KCoralError as exc:
                # Only a server of the published protocol lacks /v1/info (404). Any other
                # refusal (a wrong token's 401) is this request's failure, not a fact to keep:
                # taken as "no features", it was cached for the kernel's life, so a fixed
                # token still found no jobs API and no sessions.
                if exc.status_code not in INFO_ABSENT_STATUSES:
                    raise
                info = {}
            gpu_count = health.get("gpu_count")
            target = health.get("target")
            facts = ServerFacts(
                features=server_features(client),
                gpu_count=gpu_count if isinstance(gpu_count, int) else 0,
                target=dict(target) if isinstance(target, dict) else {},
                device=str(info.get("device") or ("gpu" if gpu_count else "cpu")),
                sandbox=str(info.get("sandbox") or ""),
                default_kind=default_kind(info),
                router=isinstance(info.get("fleet"), Mapping),
            )
            self._facts[url] = facts
        return facts

    def forget(self, url: str) -> None:
        self._facts.pop(url, None)
        for key in [k for k in self._clients if k[0] == url]:
            self._clients.pop(key).close()

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        self.stop_local()
        self.connection.withdraw()


def normalize_url(text: str) -> str:
    """A server address as a URL (``127.0.0.1:8123`` -> ``http://127.0.0.1:8123``), by the
    rule ``Client`` and ``kcoral run`` share (``kcoral.connection.server_address``); two lines when
    the
    address breaks it."""
    try:
        return server_url(text)
    except (TypeError, ValueError) as exc:
        raise ServerAddressError(
            f"not a server address: {exc}",
            "write host:port (127.0.0.1:8000, [::1]:8000) or a URL (http://host:8000)",
        ) from None


def embedded_server_supported() -> bool:
    """The embedded server (``kcoral server``: worker processes, /proc, bubblewrap) runs on
    Linux only; the client, the magics and the JupyterLab parts run everywhere."""
    return sys.platform.startswith("linux")


def platform_name() -> str:
    return {"darwin": "macOS", "win32": "Windows"}.get(
        sys.platform, platform.system() or sys.platform
    )
