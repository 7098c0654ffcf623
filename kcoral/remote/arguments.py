"""Arguments of a remote function checked on the client (CLIENT_API §8): a JSON-mode call's
values (plain JSON, whole binary arguments, text UTF-8 can carry) and the decorator's options,
each refused naming the argument or option as the user wrote it.
"""

from __future__ import annotations

import inspect
import math
import sys
from typing import Any

from kcoral.program import plain_scalars
from kcoral.protocol.headers import SERIALIZATION_FORMATS
from kcoral.protocol.utf8_text import check_text

#: What a value or callable JSON mode cannot send is told.
PICKLE_SENDS_IT = " (serialization='pickle' sends it)"
#: How a call's bytes travel, told where a str holds a lone surrogate.
BYTES_GO_AS = "bytes arguments"


def argument_labels(bound: inspect.BoundArguments, given: set[str]) -> list[str]:
    """How an error names each of ``bound.args``: by its parameter (``argument 'pair'``,
    ``argument 'rest'[1]`` for ``*rest``), with ``(its default)`` for a default the client
    bound; an index is meaningless for a default the caller never passed."""
    labels: list[str] = []
    for name, parameter in bound.signature.parameters.items():
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            labels.append(f"argument {name!r}" + ("" if name in given else " (its default)"))
        elif parameter.kind is parameter.VAR_POSITIONAL:
            rest = bound.arguments.get(name, ())
            labels.extend(f"argument {name!r}[{index}]" for index in range(len(rest)))
    if len(labels) != len(bound.args):  # never expected: fall back to positions
        return [f"argument {index}" for index in range(len(bound.args))]
    return labels


def is_binary(value: Any) -> bool:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return True
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        return True
    return hasattr(value, "__dlpack__")  # torch tensors included


def check_json(value: Any, where: str, active: set[int]) -> None:
    """``value`` must be plain JSON: exact types, finite floats, no cycles, no binary."""
    kind = type(value)
    if kind is str:
        check_text(value, where, bytes_go_as=BYTES_GO_AS)
        return
    if value is None or kind in (bool, int):
        return
    if kind is float:
        if not math.isfinite(value):
            raise ValueError(
                f"{where} is a non-finite float ({value!r}); JSON cannot carry it" + PICKLE_SENDS_IT
            )
        return
    if kind is list or kind is dict:
        if id(value) in active:
            raise ValueError(f"{where} contains a cycle")
        active.add(id(value))
        if kind is list:
            if not plain_scalars(value):  # else each item is checked, naming its index
                for index, item in enumerate(value):
                    check_json(item, f"{where}[{index}]", active)
        else:
            for key, item in value.items():
                if type(key) is not str:
                    raise TypeError(
                        f"{where} has a key of type {type(key).__name__}; JSON keys are str"
                        + PICKLE_SENDS_IT
                    )
                check_text(key, f"a key of {where}", bytes_go_as=BYTES_GO_AS)
                check_json(item, f"{where}[{key!r}]", active)
        active.discard(id(value))
        return
    if is_binary(value):
        raise TypeError(
            f"{where} is binary data inside a container; bytes and arrays must be whole "
            "arguments in JSON mode (or use serialization='pickle')"
        )
    raise TypeError(
        f"{where} is of type {kind.__name__}, not a JSON value (None, bool, int, float, str, list, "
        "dict with str keys); use serialization='pickle' for other objects"
    )


def check_call_options(timeout: object, output_limit_bytes: object) -> None:
    """The decorator's ``timeout`` and ``output_limit_bytes``, checked where they are
    written: a bad one failed only at the first call, as the server's 400 about
    ``timeout_seconds``, a name the user never wrote."""
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a number of seconds > 0, not {timeout!r}")
    if output_limit_bytes is not None:
        if isinstance(output_limit_bytes, bool) or not isinstance(output_limit_bytes, int):
            kind = type(output_limit_bytes).__name__
            raise TypeError(f"output_limit_bytes must be an int, not {kind}")
        if output_limit_bytes < 0:
            raise ValueError(f"output_limit_bytes must be >= 0, not {output_limit_bytes!r}")


def check_serialization(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if value not in SERIALIZATION_FORMATS:
        raise ValueError(f"{what} must be one of {list(SERIALIZATION_FORMATS)}, not {value!r}")
    return value
