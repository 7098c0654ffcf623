"""A callable that JSON mode cannot send (a ``functools.partial``, a builtin, a method) is
refused saying that pickle mode sends it.

Before, ``client.function()(functools.partial(f, 1))`` read only "a remote function must be a
Python function, not partial", though ``serialization='pickle'`` sends exactly that
(``test_remote_e2e``: partials and builtins run in pickle mode).
"""

from __future__ import annotations

import functools

import pytest

from kcoral.remote import RemoteFunction


def scale(factor, value):
    return factor * value


@pytest.mark.parametrize(
    ("callable_", "kind"),
    [
        (functools.partial(scale, 2), "partial"),
        (len, "builtin_function_or_method"),
        (str.upper, "method_descriptor"),
    ],
)
def test_a_callable_json_mode_cannot_send_is_refused_naming_pickle(callable_, kind) -> None:
    with pytest.raises(TypeError) as info:
        RemoteFunction(callable_, client=None)
    assert str(info.value) == (
        f"a JSON-mode remote function must be a Python function, not {kind} "
        "(serialization='pickle' sends it)"
    )
    RemoteFunction(callable_, client=None, serialization="pickle")  # which it does


def test_a_pickle_mode_partial_called_in_json_mode_names_pickle() -> None:
    function = RemoteFunction(functools.partial(scale, 2), client=None, serialization="pickle")
    with pytest.raises(TypeError, match=r"not partial \(serialization='pickle' sends it\)$"):
        function.build_program(3, serialization="json")


def test_what_is_not_callable_gets_no_pickle_hint() -> None:
    # pickle mode refuses it too: the hint would send the user in a circle
    with pytest.raises(TypeError) as info:
        RemoteFunction(3, client=None)
    assert str(info.value) == "a remote function must be callable, not int"
