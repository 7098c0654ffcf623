"""``AsyncClient`` mirrors ``Client`` member for member (EXTENSIONS §4), and so do
``AsyncSession`` and ``AsyncJob`` their blocking twins: the same names and parameters, each
call that asks the server a coroutine. ``AsyncClient`` had no ``attach_session``, and
nothing noticed. The pages that list the async client's members name each one it has, and
no other (they named six of its thirteen)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from kcoral import AsyncClient, Client
from kcoral.base_client import BaseClient
from kcoral.client_sessions import AsyncSession, Session
from kcoral.jobs import AsyncJob, Job

ROOT = Path(__file__).resolve().parents[2]
#: Members one flavour has in the other's place, or alone, by design.
RENAMED = {"__enter__": "__aenter__", "__exit__": "__aexit__"}
CLIENT_RENAMED = {**RENAMED, "close": "aclose"}  # as httpx's AsyncClient
ASYNC_ONLY = {"start"}  # an AsyncSession is created by ``async with`` or ``await .start()``
#: Calls that send nothing, so stay plain calls on both.
PLAIN = {"job", "session", "function"}
PAIRS = [(Client, AsyncClient), (Session, AsyncSession), (Job, AsyncJob)]


def members(cls: type, *, below: type) -> dict[str, object]:
    """The public members ``cls`` defines above ``below`` (a shared base's are shared)."""
    found: dict[str, object] = {}
    for klass in reversed(cls.__mro__[: cls.__mro__.index(below)]):
        for name, value in vars(klass).items():
            if not name.startswith("_") or name in RENAMED or name in RENAMED.values():
                found[name] = value
    return found


def renamed(blocking: type) -> dict[str, str]:
    return CLIENT_RENAMED if blocking is Client else RENAMED


def shared_base(blocking: type, flavour: type) -> type:
    return next(klass for klass in blocking.__mro__ if klass in flavour.__mro__)


@pytest.mark.parametrize(("blocking", "flavour"), PAIRS, ids=lambda cls: cls.__name__)
def test_the_async_flavour_has_every_member_of_the_blocking_one(
    blocking: type, flavour: type
) -> None:
    base = shared_base(blocking, flavour)
    expected = {renamed(blocking).get(name, name) for name in members(blocking, below=base)}
    assert set(members(flavour, below=base)) - ASYNC_ONLY == expected


@pytest.mark.parametrize(("blocking", "flavour"), PAIRS, ids=lambda cls: cls.__name__)
def test_each_async_member_takes_the_same_parameters_and_is_awaited_where_it_asks_the_server(
    blocking: type, flavour: type
) -> None:
    base = shared_base(blocking, flavour)
    twins = members(flavour, below=base)
    for name, member in members(blocking, below=base).items():
        twin = twins[renamed(blocking).get(name, name)]
        if not callable(member) or name.startswith("__"):
            continue
        assert list(inspect.signature(member).parameters) == list(
            inspect.signature(twin).parameters  # type: ignore[arg-type]
        ), name
        awaited = inspect.iscoroutinefunction(twin) or inspect.isasyncgenfunction(twin)
        assert awaited == (name not in PLAIN), name


#: The sentences that list what ``AsyncClient`` has: ``(`health`, `target`, ...)``.
MIRROR_LISTS = {
    "README.md": "`kcoral.AsyncClient(url)` mirrors `Client`",
    "docs/remote_functions.md": "`kcoral.AsyncClient(url)` mirrors `Client`",
    "docs/spec/EXTENSIONS.md": "`AsyncClient` mirrors `Client`",
}


@pytest.mark.parametrize("page", sorted(MIRROR_LISTS))
def test_a_page_that_lists_the_async_clients_members_names_each_one_and_no_other(page: str) -> None:
    text = " ".join((ROOT / page).read_text(encoding="utf-8").split())
    start = text.index(MIRROR_LISTS[page]) + len(MIRROR_LISTS[page])
    listed = re.findall(r"`(\w+)`", text[start : text.index(")", start)])
    assert [name for name in listed if not hasattr(AsyncClient, name)] == []
    public = {name for name in members(AsyncClient, below=BaseClient) if not name.startswith("_")}
    assert public - {"run_flow", "is_async"} <= set(listed) | {"function"}
