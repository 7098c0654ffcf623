"""Node selectors (EXTENSIONS §14, ROUTER §6): what a request needs of the node that runs it.

A selector is ``key=value[,key=value]`` over a node's labels and the built-in keys ``gpu``
(the GPU kind's short key, ``cpu`` for a CPU node), ``arch``, ``gpus`` (at least that many
GPUs) and ``node`` (the node id). It travels in the ``X-KCoral-Select`` header; the client
and the server share this one parser so a selector means the same thing at both ends.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

SELECT_HEADER = "X-KCoral-Select"
#: Keys every node has; an operator's label may not shadow one (``--node-label``).
BUILT_IN_KEYS = ("gpu", "arch", "gpus", "node")
MAX_SELECTOR_CHARS = 512
#: The error kinds of selectors (EXTENSIONS §14): 400 for a header that is no selector, 503
#: when no node (or this server) fits, 409 when a session's node does not fit its program's.
INVALID_SELECTOR = "invalid_selector"
NO_MATCHING_NODE = "no_matching_node"
SELECTOR_MISMATCH = "selector_mismatch"
MAX_SELECTOR_KEYS = 16
_KEY = re.compile(r"[a-z][a-z0-9_.-]{0,31}", re.ASCII)
_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", re.ASCII)

Selector = dict[str, str]
SelectorInput = Mapping[str, "str | int"] | str | None


class SelectorError(ValueError):
    """A selector that cannot be read; the message says what is wrong with it."""


def parse_selector(text: str) -> Selector:
    """The selector ``key=value[,key=value]`` as a map; ``SelectorError`` when malformed."""
    if len(text) > MAX_SELECTOR_CHARS:
        raise SelectorError(f"a selector is at most {MAX_SELECTOR_CHARS} characters")
    selector: Selector = {}
    for part in text.split(","):
        key, equals, value = part.strip().partition("=")
        key, value = key.strip(), value.strip()
        if not equals:
            raise SelectorError(f"selector part {part.strip()!r} must be key=value")
        _check_pair(key, value)
        if key in selector:
            raise SelectorError(f"selector gives the key {key!r} twice")
        selector[key] = value
    if len(selector) > MAX_SELECTOR_KEYS:
        raise SelectorError(f"a selector has at most {MAX_SELECTOR_KEYS} keys")
    return selector


def header_selector(values: Sequence[str]) -> Selector:
    """The selector of a request's ``X-KCoral-Select`` header values (``{}``: none, or an
    empty value); ``SelectorError`` when the header is repeated or malformed."""
    if not values:
        return {}
    if len(values) > 1:
        raise SelectorError(f"give one {SELECT_HEADER} header, not {len(values)}")
    return parse_selector(values[0]) if values[0].strip() else {}


def as_selector(select: SelectorInput) -> Selector:
    """A selector from what a caller gives: a map (``{"gpu": "h100", "gpus": 2}``), the
    text form, or None (no selector: ``{}``)."""
    if select is None:
        return {}
    if isinstance(select, str):
        return parse_selector(select) if select.strip() else {}
    selector: Selector = {}
    for key, value in select.items():
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise SelectorError(f"selector value of {key!r} must be a string or an integer")
        text = str(value)
        _check_pair(str(key), text)
        selector[str(key)] = text
    if len(selector) > MAX_SELECTOR_KEYS:
        raise SelectorError(f"a selector has at most {MAX_SELECTOR_KEYS} keys")
    return selector


def check_select(select: object) -> Selector:
    """A client call's ``select=`` as a selector, checked before anything is sent:
    ``TypeError`` for what is neither a map, a string nor None; ``SelectorError`` (a
    ``ValueError``) saying what is wrong with a malformed one."""
    if select is not None and not isinstance(select, (str, Mapping)):
        raise TypeError(
            "select must be a map such as {'gpu': 'h100'}, a string such as 'gpu=h100', "
            f"or None, not {type(select).__name__}"
        )
    try:
        return as_selector(select)
    except SelectorError as exc:
        raise SelectorError(f"select: {exc}") from None


def format_selector(selector: Mapping[str, str]) -> str:
    """The canonical text form (keys sorted), as sent in ``X-KCoral-Select``."""
    return ",".join(f"{key}={selector[key]}" for key in sorted(selector))


def offers(
    labels: Mapping[str, str], *, gpu: str, arch: str, gpus: int, node: str
) -> dict[str, str]:
    """What a node offers a selector, as ``selector_matches`` reads it: its labels and the
    built-in keys (``gpu``, ``arch`` and ``node`` only when known, ``gpus`` always)."""
    offered = dict(labels)
    for key, value in (("gpu", gpu), ("arch", arch), ("node", node)):
        if value:
            offered[key] = value
    offered["gpus"] = str(gpus)
    return offered


def selector_matches(selector: Mapping[str, str], offered: Mapping[str, str]) -> bool:
    """Whether a node offering ``offered`` (its labels and built-in keys, values as text)
    fits ``selector``: ``gpus=N`` means at least N GPUs, every other key is equality."""
    for key, wanted in selector.items():
        have = offered.get(key)
        if have is None:
            return False
        if key == "gpus":
            if not (have.isdigit() and int(have) >= int(wanted)):
                return False
        elif have != wanted:
            return False
    return True


def session_mismatch(where: str, selector: Mapping[str, str]) -> str:
    """The ``409 selector_mismatch`` message for a session's program: ``where`` its session
    runs (``node n1``, ``this server``)."""
    return (
        f"the session runs on {where}, which does not fit the selector "
        f"{format_selector(selector)}; a session's programs run where the session is"
    )


def _check_pair(key: str, value: str) -> None:
    if not _KEY.fullmatch(key):
        raise SelectorError(
            f"selector key {key!r} must be 1-32 characters: a lowercase ASCII letter, "
            "then [a-z0-9_.-]"
        )
    if not _VALUE.fullmatch(value):
        raise SelectorError(
            f"selector value of {key!r} must be 1-64 characters: an ASCII letter or digit, "
            "then [A-Za-z0-9_.-]"
        )
    if key == "gpus" and not value.isdigit():
        raise SelectorError(f"selector gpus={value} must be a whole number (at least N GPUs)")
