"""Configuration and errors of the benchmark helpers (SERVER §15, EXTENSIONS §12): the
trailing ``dict`` of ``benchmark`` and ``compare``, validated once into ``BenchmarkConfig``;
helper failures as ``ExecutionError`` with messages cut to 600 characters."""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kcoral.bench.units import duration
from kcoral.protocol.errors import ExecutionError

MESSAGE_LIMIT = 600
TRUNCATION_MARK = "…[truncated]…"
ZERO_ESTIMATE_COUNT = 1000
#: Samples a result carries by default, and at most (about 40 bytes of JSON each, so the
#: largest is a few MB, far below the server's default --max-response-bytes of 256 MiB).
DEFAULT_MAX_SAMPLES = 1000
MAX_SAMPLES_LIMIT = 100_000
#: The adaptive mode's default measuring budget.
DEFAULT_ADAPTIVE_MAX_MS = 2000.0
LABEL_LIMIT = 200
#: The most calls one measurement makes, whatever its budget says (keeps memory bounded);
#: an explicit ``warmup`` or ``repeat`` above it is refused, a budget's count is capped to it.
MAX_CALLS = 100_000


def truncate_message(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` if it fits in ``limit`` characters, else its start and end around a mark."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - len(TRUNCATION_MARK))
    head = (keep + 1) // 2
    tail = keep - head
    return text[:head] + TRUNCATION_MARK + (text[len(text) - tail :] if tail else "")


def helper_error(kind: str, message: str) -> ExecutionError:
    """The helper failure of ``kind``, its message cut to ``MESSAGE_LIMIT``."""
    return ExecutionError(kind, truncate_message(message))


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception (its type alone when the message is empty or
    cannot be made: a user's ``__str__`` that raises must not end a whole comparison)."""
    try:
        text = str(exc)
    except Exception:
        text = ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def numbered(call: int, failure: str, included: str = "warm-up") -> str:
    """``failure`` (``describe``'s text) of the ``call``-th call, ``included`` counted: the
    first call's failure is the function's own, a later one's came after calls that returned
    (a flaky call, or state a call leaves), which the bare text did not tell apart."""
    if call <= 1:
        return failure
    return f"{failure} (in call {call}, {included} included)"


def why_not_timeable(fn: object) -> str | None:
    """Why timing calls of ``fn`` would measure nothing, else ``None``: a call of an async or
    generator function only creates a coroutine or generator, which nobody runs."""
    name = getattr(fn, "__name__", type(fn).__name__)
    if inspect.iscoroutinefunction(fn):
        return (
            f"{name} is an async function: a call only creates a coroutine and runs none of "
            f"it; time a function that runs it (e.g. lambda: asyncio.run({name}()))"
        )
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        return (
            f"{name} is a generator function: a call only creates a generator and runs none "
            f"of it; time a function that consumes it (e.g. lambda: list({name}()))"
        )
    return None


# ---------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class BenchmarkConfig:
    """The trailing configuration ``dict`` of ``benchmark`` (SERVER §15 table)."""

    warmup_ms: float = 25.0
    repeat_ms: float = 100.0
    warmup: int | None = None
    repeat: int | None = None
    flush_l2: bool = True
    # EXTENSIONS §12: samples kept, the adaptive mode, throttled rounds, a history label
    max_samples: int = DEFAULT_MAX_SAMPLES
    target_precision: float | None = None
    max_ms: float = DEFAULT_ADAPTIVE_MAX_MS
    discard_throttled: bool = False
    label: str | None = None


def _budget(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise helper_error("runtime", f"benchmark config {key!r} must be a number, not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise helper_error(
            "runtime", f"benchmark config {key!r} must be finite and >= 0, not {value!r}"
        )
    return float(value)


def _count(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise helper_error("runtime", f"benchmark config {key!r} must be an integer, not {value!r}")
    if value < 1:
        raise helper_error("runtime", f"benchmark config {key!r} must be at least 1, not {value!r}")
    if value > MAX_CALLS and key in ("warmup", "repeat"):
        raise helper_error(
            "runtime",
            f"benchmark config {key!r} must be at most {MAX_CALLS} (the calls one measurement "
            f"makes at most), not {truncate_message(repr(value), 80)}",
        )
    return value


def _flag(config: Mapping[str, Any], key: str, default: bool) -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise helper_error("runtime", f"benchmark config {key!r} must be a boolean, not {value!r}")
    return value


def _precision(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise helper_error(
            "runtime", f"benchmark config 'target_precision' must be a number, not {value!r}"
        )
    if not (0 < value <= 1):
        raise helper_error(
            "runtime",
            f"benchmark config 'target_precision' must be in (0, 1], not {value!r}",
        )
    return float(value)


def _label(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > LABEL_LIMIT:
        raise helper_error(
            "runtime",
            f"benchmark config 'label' must be a non-empty string of at most {LABEL_LIMIT} "
            f"characters, not {truncate_message(repr(value), 80)}",
        )
    return value


#: The keys ``benchmark`` accepts; ``compare`` accepts these and its own.
BENCHMARK_KEYS = frozenset(
    {
        "warmup_ms",
        "repeat_ms",
        "warmup",
        "repeat",
        "flush_l2",
        "max_samples",
        "target_precision",
        "max_ms",
        "discard_throttled",
        "label",
    }
)


def parse_config(
    config: Mapping[str, Any] | None, extra_keys: frozenset[str] = frozenset()
) -> BenchmarkConfig:
    """Validate a configuration mapping; unknown keys and bad values fail with ``runtime``.

    ``extra_keys`` are accepted and left to the caller (``compare``'s own keys)."""
    if config is None:
        return BenchmarkConfig()
    known = BENCHMARK_KEYS | extra_keys
    unknown = sorted(str(key) for key in config if key not in known)
    if unknown:
        raise helper_error(
            "runtime",
            f"unknown benchmark config key(s) {unknown}; expected some of {sorted(known)}",
        )
    if "max_ms" in config and config.get("target_precision") is None:
        # ignored, a budget the user set would be a silent no-op (a fixed run's is repeat_ms)
        raise helper_error(
            "runtime",
            "benchmark config 'max_ms' is the adaptive mode's budget and needs "
            "'target_precision'; a fixed run's budget is 'repeat_ms'",
        )
    max_samples = config.get("max_samples", DEFAULT_MAX_SAMPLES)
    if _count("max_samples", max_samples) > MAX_SAMPLES_LIMIT:
        raise helper_error(
            "runtime", f"benchmark config 'max_samples' must be at most {MAX_SAMPLES_LIMIT}"
        )
    return BenchmarkConfig(
        warmup_ms=_budget("warmup_ms", config.get("warmup_ms", 25.0)),
        repeat_ms=_budget("repeat_ms", config.get("repeat_ms", 100.0)),
        warmup=None if config.get("warmup") is None else _count("warmup", config["warmup"]),
        repeat=None if config.get("repeat") is None else _count("repeat", config["repeat"]),
        flush_l2=_flag(config, "flush_l2", True),
        max_samples=max_samples,
        target_precision=_precision(config.get("target_precision")),
        max_ms=_budget("max_ms", config.get("max_ms", DEFAULT_ADAPTIVE_MAX_MS)),
        discard_throttled=_flag(config, "discard_throttled", False),
        label=_label(config.get("label")),
    )


def calls_for_budget(budget_ms: float, estimate_ms: float) -> int:
    """max(1, ⌊budget / estimate⌋), and 1000 when the estimate is 0 (SERVER §15); at most
    ``MAX_CALLS``, so a large budget over a tiny estimate cannot ask for billions of calls."""
    if estimate_ms <= 0:
        return ZERO_ESTIMATE_COUNT
    calls = budget_ms / estimate_ms  # inf for a huge budget over a tiny estimate
    return MAX_CALLS if calls >= MAX_CALLS else max(1, math.floor(calls))


def budget_cap_warning(
    key: str, budget_ms: float, estimate_ms: float, what: str = "calls"
) -> str | None:
    """The warning that ``calls_for_budget`` capped the budget ``key``'s count to
    ``MAX_CALLS``, else ``None``: without it ``repeat_ms: 1e12`` took its 100000 calls (minutes
    of them) and said nothing about the count it was not given."""
    if estimate_ms <= 0 or budget_ms / estimate_ms < MAX_CALLS + 1:
        return None
    return (
        f"{key} {budget_ms:g} asks for over {MAX_CALLS} calls of {duration(estimate_ms)}; "
        f"capped at {MAX_CALLS} (max_calls)"
    )
