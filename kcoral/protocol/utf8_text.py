"""Text a request carries: UTF-8, which no lone surrogate encodes to. Undecodable bytes of a
file name or a command line arrive in Python as lone surrogates (``'\\udcff'``, from
``surrogateescape`` decoding); the client refuses them where they are given, naming them,
not when the whole request fails to encode (CLIENT_API §5, §8, §11)."""

from __future__ import annotations

import os


def is_utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8: it holds no lone surrogate."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(text: str, what: str, *, bytes_go_as: str = "a bytes upload") -> None:
    """``ValueError`` naming ``what`` and the first lone surrogate in ``text``: one passed
    every builder call, then failed at ``execute`` as 'cannot encode the request: ... in
    position 96', a place in the whole request that named nothing the user wrote.
    ``bytes_go_as`` says how the caller's bytes travel instead."""
    if text.isascii() or is_utf8(text):
        return
    at = next(index for index, char in enumerate(text) if "\ud800" <= char <= "\udfff")
    raise ValueError(
        f"{what} holds a lone surrogate at position {at} ({text[at]!r}), which UTF-8 "
        f"cannot carry (bytes travel as {bytes_go_as})"
    )


def as_its_bytes(name: str) -> str:
    """A local ``name`` with the bytes that are not UTF-8 shown as ``ls -b`` shows them
    (``\\xff``), not as the surrogates Python decodes them to (``\\udcff``)."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")
