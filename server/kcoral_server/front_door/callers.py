"""Who sent a request: client tokens mapped to named identities (EXTENSIONS §6).

A token file holds either one bare token (identity ``default``) or one ``NAME TOKEN
[admin]`` line per identity (blank lines and ``#`` comments are ignored). A server without
any client token serves everyone as ``default``: all callers then share jobs and cache,
which is why such a server listens on loopback only.

Behind a router, the node's child server holds no client tokens at all: the router
authenticates the client and the tunnel presents the node's *router secret* together with
the identity in ``X-KCoral-Identity``. That header is believed only from a request carrying
the router secret, so a program or a local user who reaches the child's loopback port
cannot claim another identity.

Standard library only: ``kcoral_server.settings.config`` reads token files through this module.
"""

from __future__ import annotations

import hmac
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass

from kcoral.protocol.headers import PRINTABLE_TOKEN

IDENTITY_HEADER = "X-KCoral-Identity"
#: What a node's supervisor and its child server log on SIGHUP (``token_reload_skipped``):
#: the client tokens are the router's (ROUTER §3), so the signal changes nothing there.
NODE_HANGUP = "SIGHUP: a node holds no client tokens; send SIGHUP to its router to reload them"
ADMIN_MARK = "admin"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}", re.ASCII)


@dataclass(frozen=True)
class Identity:
    """An authenticated caller. ``admin`` sees every identity's jobs and sessions."""

    name: str
    admin: bool = False

    def owns(self, owner: str) -> bool:
        """Whether this identity may see and act on something ``owner`` created."""
        return self.admin or owner == self.name

    def header_value(self) -> str:
        """How the router names this identity to a node (``NAME`` or ``NAME;admin``)."""
        return f"{self.name};{ADMIN_MARK}" if self.admin else self.name


DEFAULT = Identity("default")


def valid_identity_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def parse_identity_header(value: str | None) -> Identity | None:
    """``NAME`` or ``NAME;admin`` as the router sends it; None if malformed."""
    if value is None:
        return None
    name, _, flag = value.strip().partition(";")
    if not valid_identity_name(name) or flag not in ("", ADMIN_MARK):
        return None
    return Identity(name, admin=flag == ADMIN_MARK)


def _token_lines(text: str) -> list[tuple[int, list[str]]]:
    """A token file's lines that say something (not blank, not comments), numbered, split."""
    return [
        (number, line.split())
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]


def is_bare_token(text: str) -> bool:
    """Whether a token file's text is one bare token, not ``NAME TOKEN`` lines (a file that
    names one identity ``default`` is the latter, though its identity reads the same)."""
    lines = _token_lines(text)
    return len(lines) == 1 and len(lines[0][1]) == 1


def parse_tokens(text: str) -> dict[str, Identity]:
    """Token -> identity from a token file's text; ``ValueError`` names the bad line, never
    a token. A token is printable ASCII without spaces (``PRINTABLE_TOKEN``): all an
    ``Authorization`` header carries the same way on every client and server. Any
    whitespace separates fields (a no-break space pasted from a web page meant a space): no
    token can hold one, so a split never cuts a token short."""
    lines = _token_lines(text)
    if not lines:
        raise ValueError("is empty")
    if is_bare_token(text):
        number, (token,) = lines[0]
        if PRINTABLE_TOKEN.fullmatch(token) is None:
            raise ValueError(f"line {number}: the token is not printable ASCII")
        return {token: DEFAULT}
    tokens: dict[str, Identity] = {}
    names: set[str] = set()
    for number, fields in lines:
        if len(fields) not in (2, 3) or (len(fields) == 3 and fields[2] != ADMIN_MARK):
            raise ValueError(f"line {number}: expected 'NAME TOKEN' or 'NAME TOKEN admin'")
        name, token = fields[0], fields[1]
        if not valid_identity_name(name):
            raise ValueError(f"line {number}: invalid identity name {name!r}")
        if name in names:
            raise ValueError(f"line {number}: identity {name!r} is listed twice")
        if PRINTABLE_TOKEN.fullmatch(token) is None:
            raise ValueError(f"line {number}: the token of {name!r} is not printable ASCII")
        if token in tokens:
            raise ValueError(f"line {number}: the token of {name!r} is already used")
        names.add(name)
        tokens[token] = Identity(name, admin=len(fields) == 3)
    return tokens


def identity_count(text: str | None) -> int:
    """How many identities a token file's ``text`` names (None, no file: one, ``default``);
    a file that cannot be parsed counts as one (its refusal comes where it is read)."""
    if text is None:
        return 1
    try:
        return max(1, len({who.name for who in parse_tokens(text).values()}))
    except ValueError:
        return 1


class Authenticator:
    """Bearer header -> identity, in constant time per token.

    ``tokens`` None (and no router secret): the server is open and everyone is ``default``.
    """

    def __init__(
        self, tokens: Mapping[str, Identity] | None, router_secret: str | None = None
    ) -> None:
        self._tokens = [(f"Bearer {t}".encode(), who) for t, who in (tokens or {}).items()]
        self._router = f"Bearer {router_secret}".encode() if router_secret else None
        self.open = tokens is None and router_secret is None
        # How many identities can call (fair session seats): an open server serves one,
        # ``default``; behind a router the identities are the router's, unknown here.
        names = {who.name for who in (tokens or {}).values()}
        self.identity_count: int | None = None if router_secret else max(1, len(names))
        # A node's child: no client token, only its tunnel's secret. It then requires that
        # secret on every endpoint, /health and /internal/worker-status included (ROUTER §12).
        self.tunnel_only = tokens is None and router_secret is not None

    def identities(self) -> dict[str, Identity]:
        """Name -> identity of every client token (empty: no client tokens)."""
        return {who.name: who for _, who in self._tokens}

    def authenticate(
        self, authorization: str | None, identity_header: str | None
    ) -> Identity | None:
        """The caller's identity, or None when the request must be refused (401)."""
        if self.open:
            return DEFAULT
        given = (authorization or "").encode("utf-8", "surrogateescape")
        if self._router is not None and hmac.compare_digest(given, self._router):
            if identity_header is None:
                return DEFAULT
            return parse_identity_header(identity_header)
        found = None
        for expected, who in self._tokens:  # every comparison runs: no timing hint of which
            if hmac.compare_digest(given, expected):
                found = who
        return found


def token_file_exposure(path: str | os.PathLike[str]) -> str | None:
    """Why the client-token file ``path`` is open to more people than it should be, or None
    (the message leads with the mode and the fix: a console line may be cut).

    Who can reach it: every local user who can read it may act as any identity it names,
    and whoever can write it may add an identity of their own (an admin one included). Its
    group may still read it: a Kubernetes Secret is mounted root-owned for the pod's
    ``fsGroup`` (``deploy/kubernetes``). A warning, not a refusal: a server or router that
    started with such a file before still starts."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # read already, or refused, where the settings are checked
    exposed = [
        who
        for who, bits in (("others can read it", 0o004), ("others can write it", 0o002))
        if mode & bits
    ]
    if mode & 0o020:
        exposed.append("its group can write it")
    if not exposed:
        return None
    return (
        f"mode {stat.S_IMODE(mode):04o}, {' and '.join(exposed)}: chmod 600 it"
        " (whoever reads it may act as any identity it names)"
    )
