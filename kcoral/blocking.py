"""Waiting for a coroutine from synchronous code, also in a thread whose event loop runs.

A remote function bound to an ``AsyncClient`` (or ``AsyncSession``) can still be called
with a plain ``f.remote(...)``; in a Jupyter kernel that call comes from a thread whose loop
is running, where no second loop may start.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_blocking(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to completion from synchronous code.

    In a thread that already runs an event loop (a Jupyter kernel) no second loop may start
    there, so the coroutine runs on a helper thread's own loop while this thread waits. An
    interrupt of the wait (the kernel's Stop) cancels it there, which closes its request's
    connection so the server cancels the program (EXTENSIONS §9); before, the program ran on
    to its end for a cell that had ended.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    values: list[T] = []
    errors: list[BaseException] = []
    running: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[T]]] = []
    interrupted = threading.Event()

    async def call() -> T:
        task = asyncio.ensure_future(coroutine)
        running.append((asyncio.get_running_loop(), task))
        if interrupted.is_set():  # set before `running` was seen: cancel here instead
            task.cancel()
        return await task

    def target() -> None:
        try:
            values.append(asyncio.run(call()))
        except BaseException as exc:  # handed to the waiting thread as is
            errors.append(exc)

    thread = threading.Thread(target=target, name="kcoral-blocking-call", daemon=True)
    thread.start()
    try:
        thread.join()
    except BaseException:
        interrupted.set()
        for loop, task in running:
            with contextlib.suppress(RuntimeError):  # its loop has closed: nothing runs
                loop.call_soon_threadsafe(task.cancel)
        raise
    if errors:
        raise errors[0]
    return values[0]
