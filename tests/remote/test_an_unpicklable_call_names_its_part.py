"""A pickle-mode call that cannot be pickled says which part cannot.

cloudpickle's own error (``TypeError: cannot pickle '_thread.lock' object``) reached the
caller from deep inside its dump, naming no argument, nor the function's globals.
"""

from __future__ import annotations

import threading

import pytest

from kcoral.remote import RemoteFunction

LOCK = threading.Lock()


def takes(a, *rest, key=None):
    return a


def uses_a_global_lock():
    with LOCK:
        return 1


def pickled(fn):
    return RemoteFunction(fn, client=None, serialization="pickle")


@pytest.mark.parametrize(
    ("args", "kwargs", "part"),
    [
        ((LOCK,), {}, "argument 'a'"),
        ((1, 2, LOCK), {}, r"argument 'rest'\[1\]"),
        ((1,), {"key": [LOCK]}, "argument 'key'"),
    ],
)
def test_an_argument_that_cannot_be_pickled_is_named(args, kwargs, part) -> None:
    with pytest.raises(TypeError, match=rf"^takes\(\): {part} cannot be pickled: TypeError: "):
        pickled(takes).build_program(*args, **kwargs)


def test_a_function_whose_globals_cannot_be_pickled_says_so() -> None:
    with pytest.raises(
        TypeError,
        match=r"^uses_a_global_lock\(\): the function \(with the globals and closure it uses\) "
        r"cannot be pickled: TypeError: cannot pickle '_thread.lock' object$",
    ):
        pickled(uses_a_global_lock).build_program()
