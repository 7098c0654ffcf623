"""Functions defined in a real file, so JSON-mode source capture can read them."""

from __future__ import annotations

import functools
import math

LIMIT = 3


def fake_decorator(fn):
    return fn


def client_stand_in_function(fn):
    return fn


def scaled_sum(x: int, y: float = 2.5, *rest: int, scale: int = 2, **extra: object) -> float:
    """Docstring stays."""
    # a comment in the body stays too
    import statistics

    total = (x + y + sum(rest)) * scale
    return {"total": total, "extra": sorted(extra), "mean": statistics.mean([1, 2])}


async def doubled(x):
    return x * 2


def factorial(n):
    return 1 if n <= 1 else n * factorial(n - 1)


def uses_module_global(x):
    return math.sqrt(x)


def uses_constant(x):
    return x + LIMIT


def len(value):
    return 0


def uses_shadowed_builtin(x):
    return len(x)


@fake_decorator
def decorated(x):
    return x


@functools.lru_cache
def cached(x):
    return x


def make_closure():
    offset = 5

    def add_offset(x):
        return x + offset

    return add_offset


def generator(x):
    yield x


def takes_run_async(x, run_async=False):
    return x


def takes_serialization(x, *, serialization="json"):
    return x


def one_liner(x, y=1):
    return x + y


def with_class(x):
    class Box:
        size = x

        def twice(self):
            return self.size * 2

    return Box().twice()


def echo(*args, **kwargs):
    return [list(args), kwargs]


def with_tuple_default(x, pair=(1, 2)):
    return [x, list(pair)]


def positive(x):
    assert x > 0, "x must be positive"
    return x


class Pair:
    """A class of this helper module (which the server cannot import) for pickle-mode
    arguments."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def total(self):
        return self.first + self.second
