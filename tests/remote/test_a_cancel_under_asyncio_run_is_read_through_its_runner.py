"""A ``run_async`` call cancelled under ``asyncio.run`` reads as a Ctrl-C only where the
runner's SIGINT handler counted one. That count is ``asyncio.Runner._interrupt_count``, a
private attribute: a Python that renames it, or a handler that is not the runner's, must
leave the cancel as it is (a ``CancelledError``), never call every cancel an interrupt.
The real Ctrl-C is sent to a real process in test_interrupted_and_failed_calls_read_short.py.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from types import SimpleNamespace

import pytest

from kcoral.remote.report import ctrl_c_said

pytestmark = pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason="asyncio.Runner (and a Ctrl-C that cancels the task) is 3.11+",
)

CALLER = SimpleNamespace(base_url="http://127.0.0.1:1")


def _said_inside_asyncio_run(interrupts: int | None) -> BaseException:
    """What ``ctrl_c_said`` makes of a cancel inside ``asyncio.run`` whose runner counted
    ``interrupts`` Ctrl-Cs (None: a runner without the count at all)."""

    async def main() -> BaseException:
        handler = signal.getsignal(signal.SIGINT)
        runner = handler.func.__self__  # type: ignore[union-attr]
        assert type(runner).__name__ == "Runner", "asyncio.run installs its runner's handler"
        if interrupts is None:
            del runner._interrupt_count
        else:
            runner._interrupt_count = interrupts
        said = ctrl_c_said(asyncio.CancelledError(), "f", CALLER)
        runner._interrupt_count = 0  # the runner reads it again on its way out
        return said

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("asyncio.run installs its Ctrl-C handler only over Python's default one")
    return asyncio.run(main())


def test_a_cancel_the_runners_ctrl_c_made_reads_as_the_remote_call_interrupted() -> None:
    said = _said_inside_asyncio_run(1)
    assert isinstance(said, KeyboardInterrupt)
    assert "the remote call f() on http://127.0.0.1:1 was cancelled" in str(said)


def test_a_cancel_with_no_ctrl_c_counted_stays_a_cancel() -> None:
    assert isinstance(_said_inside_asyncio_run(0), asyncio.CancelledError)


def test_a_cancel_stays_a_cancel_where_the_runner_keeps_no_interrupt_count() -> None:
    assert isinstance(_said_inside_asyncio_run(None), asyncio.CancelledError)


def test_a_cancel_outside_asyncio_run_stays_a_cancel() -> None:
    assert isinstance(ctrl_c_said(asyncio.CancelledError(), "f", CALLER), asyncio.CancelledError)
