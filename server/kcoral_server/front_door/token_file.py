"""Reading a token file: a server's and a router's ``--auth-token-file`` (at start and at each
``SIGHUP``, EXTENSIONS §6) and a router's ``--node-token-file`` (ROUTER §3), one reader for
all, so that every one is bounded and says its problems the same way.

A token file holds a few lines, so one over ``MAX_TOKEN_FILE_BYTES`` is a mistake (a path
pointed at a log, a disk image, ``/dev/zero``): it is refused after reading one byte past the
bound, never read whole. Before, a server or router read any such file into memory, at start
and (on the event loop, every request waiting) at a reload.

Standard library only: ``kcoral_server.settings.config`` reads token files through this module.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from kcoral_server.front_door.callers import Identity, parse_tokens

MAX_TOKEN_FILE_BYTES = 1 << 20
#: How the bound reads in a refusal.
TOKEN_FILE_BOUND = "1 MiB"


class TokenFileError(ValueError):
    """What is wrong with a token file (``is empty``, ``line 2: ...``), without naming the
    file: the caller says which (a flag at start, the path at a reload). Never its bytes:
    they may be a token."""


@dataclass(frozen=True)
class ClientTokens:
    """A client-token file read and checked: its stripped text and what it grants (token ->
    identity), parsed once."""

    text: str
    tokens: dict[str, Identity]


def cannot_read(exc: OSError) -> TokenFileError:
    """A token file the system refused to open or read: the system's reason."""
    return TokenFileError(f"cannot be read: {exc.strerror or type(exc).__name__}")


def read_token_text(path: str | os.PathLike[str], *, regular_only: bool = False) -> str:
    """The UTF-8 text of the token file ``path``, at most ``MAX_TOKEN_FILE_BYTES``;
    ``TokenFileError`` says why not. ``regular_only`` (a reload): only a regular file, opened
    without waiting: opening a FIFO that no writer holds open blocks until one does, and a
    reload runs on the event loop, so every request, ``/health`` included, would wait with
    it. At start any file is read (a pipe may bring the secret)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_NONBLOCK if regular_only else 0)
    try:
        descriptor = os.open(path, flags)
        with open(descriptor, "rb") as handle:
            if regular_only and not stat.S_ISREG(os.fstat(descriptor).st_mode):
                raise TokenFileError("is not a regular file")
            data = handle.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        raise cannot_read(exc) from None
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise TokenFileError(f"is larger than {TOKEN_FILE_BOUND}, the bound of a token file")
    try:
        # A byte order mark (a file saved by Notepad) is no part of the text: kept, it would
        # stand in front of the first token or name, where nobody sees it.
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:  # where, never the bytes around it: they may be a token
        raise TokenFileError(f"is not UTF-8 text (byte {exc.start})") from None


def refusal(flag: str, path: str | os.PathLike[str], problem: TokenFileError) -> str:
    """A token file's problem as a start-up refusal says it: the option, the file and the
    problem (``--auth-token-file /etc/kcoral/client.token is empty``). Before, it named only
    the option, and an operator with several token files guessed which.

    A path that does not exist may be the token itself, pasted where its file goes: such a
    path is shown only where it cannot be one (in a folder that exists, or a short name with
    a dot: a generated token holds neither ``.`` nor, mostly, an existing folder's name)."""
    shown = os.fspath(path)
    if not os.path.lexists(shown):
        folder, name = os.path.split(shown)
        in_a_folder = folder not in ("", os.sep) and os.path.isdir(folder)
        named_like_a_file = "." in name and len(name) <= 64
        if not (in_a_folder or named_like_a_file):
            return f"{flag} {problem}"
    at = "," if str(problem).startswith("line ") else ""  # "client.token, line 2: ..."
    return f"{flag} {shown}{at} {problem}"


def read_client_tokens(path: str | os.PathLike[str], *, regular_only: bool = False) -> ClientTokens:
    """A client-token file (``--auth-token-file``), read (``read_token_text``) and checked
    (``parse_tokens``: one bare token, or ``NAME TOKEN [admin]`` lines); ``TokenFileError``
    says what is wrong. At start (not ``regular_only``) a path that does not exist says the
    option names a file: the likeliest such path is the token itself, pasted where its file
    goes, and it is never shown."""
    try:
        text = read_token_text(path, regular_only=regular_only).strip()
    except TokenFileError as exc:
        if regular_only or os.path.lexists(path):
            raise
        raise TokenFileError(
            f"{exc} (it names a file holding the token; KCORAL_AUTH_TOKEN takes the token itself)"
        ) from None
    if not text:
        raise TokenFileError("is empty")
    try:
        return ClientTokens(text, parse_tokens(text))
    except ValueError as exc:
        raise TokenFileError(str(exc)) from None
