"""Correctness before timing (EXTENSIONS §12.3): clone a candidate's arguments, take its
result (its return value, or the arguments it wrote into), and check it against a reference.

Tensors are compared with ``allclose`` semantics on their own device (torch or numpy), other
values by equality; containers element by element. torch is used only when the value is a
torch tensor (it is then already imported by the caller's code).
"""

from __future__ import annotations

import copy
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Check:
    """The outcome of one comparison with the reference."""

    matches: bool
    max_abs_error: float | None = None
    message: str | None = None


def clone(value: Any) -> Any:
    """A copy a candidate may write into without another candidate seeing it: tensors and
    arrays are cloned on their device, containers cloned item by item, other objects deep
    copied where they can be (an object that cannot be copied, e.g. a compiled kernel, is
    shared: it is code, not data)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().clone()
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        return value.copy()
    if isinstance(value, list):
        return [clone(item) for item in value]
    if isinstance(value, tuple):
        return tuple(clone(item) for item in value)
    if isinstance(value, dict):
        return {key: clone(item) for key, item in value.items()}
    if callable(value):
        return value
    try:
        return copy.deepcopy(value)
    except Exception:
        return value


def result_of(fn: Callable[..., Any], args: Sequence[Any], outputs: Sequence[int] | None) -> Any:
    """Call ``fn(*args)``; its result is the return value, or with ``outputs`` the named
    arguments after the call (one position: that argument; several: a tuple)."""
    returned = fn(*args)
    if outputs is None:
        return returned
    written = tuple(args[i] for i in outputs)
    return written[0] if len(written) == 1 else written


def check(actual: Any, expected: Any, rtol: float, atol: float) -> Check:
    """Whether ``actual`` matches ``expected`` within ``rtol``/``atol`` (for tensors)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(actual, torch.Tensor):
        return _check_torch(torch, actual, expected, rtol, atol)
    numpy = sys.modules.get("numpy")
    if numpy is not None and (
        isinstance(actual, numpy.ndarray) or isinstance(expected, numpy.ndarray)
    ):
        return _check_numpy(numpy, actual, expected, rtol, atol)
    if isinstance(actual, (list, tuple)) and isinstance(expected, (list, tuple)):
        if len(actual) != len(expected):
            return Check(
                False, None, f"{len(actual)} items where the reference has {len(expected)}"
            )
        worst: float | None = None
        for position, (left, right) in enumerate(zip(actual, expected, strict=True)):
            item = check(left, right, rtol, atol)
            if item.max_abs_error is not None:
                worst = max(worst or 0.0, item.max_abs_error)
            if not item.matches:
                return Check(False, item.max_abs_error, f"item {position}: {item.message}")
        return Check(True, worst)
    try:
        equal = bool(actual == expected) or _both_nan(actual, expected)
    except Exception as exc:
        return Check(False, None, f"cannot compare with the reference: {type(exc).__name__}")
    if equal:
        return Check(True, None)
    return Check(False, None, f"{_short(actual)} differs from the reference {_short(expected)}")


def _check_torch(torch: Any, actual: Any, expected: Any, rtol: float, atol: float) -> Check:
    try:
        wanted = torch.as_tensor(expected, device=actual.device)
    except Exception as exc:
        return Check(False, None, f"the reference is not a tensor: {type(exc).__name__}")
    if tuple(actual.shape) != tuple(wanted.shape):
        return Check(
            False,
            None,
            f"shape {tuple(actual.shape)} where the reference has {tuple(wanted.shape)}",
        )
    if actual.numel() == 0:
        return Check(True, 0.0)
    left, right = actual.detach().double(), wanted.detach().double()
    same = (left == right) | (left.isnan() & right.isnan())  # NaN where the reference has NaN
    gaps = torch.where(same, 0.0, (left - right).abs())
    undefined = int((~gaps.isfinite()).sum().item())
    matches = bool(torch.allclose(left, right, rtol=rtol, atol=atol, equal_nan=True))
    return _verdict(matches, float(gaps.max().item()), undefined, rtol, atol)


def _check_numpy(numpy: Any, actual: Any, expected: Any, rtol: float, atol: float) -> Check:
    try:
        left = numpy.asarray(actual, dtype=float)
        right = numpy.asarray(expected, dtype=float)
    except Exception as exc:
        return Check(False, None, f"not comparable with the reference: {type(exc).__name__}")
    if left.shape != right.shape:
        return Check(False, None, f"shape {left.shape} where the reference has {right.shape}")
    if left.size == 0:
        return Check(True, 0.0)
    same = (left == right) | (numpy.isnan(left) & numpy.isnan(right))
    with numpy.errstate(invalid="ignore"):  # inf - inf where ``same`` already says equal
        gaps = numpy.where(same, 0.0, numpy.abs(left - right))
    undefined = int((~numpy.isfinite(gaps)).sum())
    matches = bool(numpy.allclose(left, right, rtol=rtol, atol=atol, equal_nan=True))
    return _verdict(matches, float(gaps.max()), undefined, rtol, atol)


def _both_nan(actual: Any, expected: Any) -> bool:
    """NaN matches a NaN reference, as in tensors (a masked or undefined result); NaN is the
    one number unequal to itself."""
    numbers = (float, complex)
    if not (isinstance(actual, numbers) and isinstance(expected, numbers)):
        return False
    return actual != actual and expected != expected


def _verdict(matches: bool, error: float, undefined: int, rtol: float, atol: float) -> Check:
    """The check of two arrays whose largest difference is ``error``, ``undefined`` of their
    differences being NaN or infinite (a NaN where the reference has a number): those have
    no size, so ``max_abs_error`` is then ``None`` and the message counts them."""
    if matches:
        return Check(True, error if math.isfinite(error) else None)
    if undefined:
        places = "1 place" if undefined == 1 else f"{undefined} places"
        return Check(
            False, None, f"{_beyond(rtol, atol)}; at {places} the difference is NaN or infinite"
        )
    return Check(False, error, _beyond(rtol, atol))


def _beyond(rtol: float, atol: float) -> str:
    return f"differs from the reference beyond rtol={rtol:g}, atol={atol:g}"


def _short(value: Any) -> str:
    """``repr(value)`` on one line, at most 80 characters: a tensor's repr breaks its rows
    over lines, which a table's line showed as ``tensor([[2., 2.],?        [2., 2.]])``."""
    text = re.sub(r"\n\s*", " ", repr(value))  # a str's repr has no raw newline to lose
    return text if len(text) <= 80 else text[:77] + "..."
