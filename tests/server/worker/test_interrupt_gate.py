"""``InterruptGate`` with real ``SIGINT``s sent to this process: it raises
``KeyboardInterrupt`` only inside uploaded code (``worker.state``)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from kcoral_server.worker.state import InterruptGate


@pytest.fixture
def gate() -> Iterator[InterruptGate]:
    before = signal.getsignal(signal.SIGINT)
    gate = InterruptGate()
    gate.install()
    try:
        yield gate
    finally:
        signal.signal(signal.SIGINT, before)


def interrupt_self() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    signal.pthread_sigmask(signal.SIG_BLOCK, [])  # a C call: pending handlers run after it


def test_a_signal_inside_uploaded_code_raises_keyboardinterrupt_there(gate) -> None:
    reached = []
    with gate.program(), pytest.raises(KeyboardInterrupt), gate.user_code():
        interrupt_self()
        reached.append("after")
    assert reached == []


def test_a_signal_in_the_workers_own_code_is_raised_as_the_programs_next_code_starts(
    gate,
) -> None:
    with gate.program():
        interrupt_self()  # the worker's own code: nothing raised here
        assert gate.pending
        with pytest.raises(KeyboardInterrupt), gate.user_code():
            pytest.fail("the uploaded code ran despite the interrupt")
        with gate.user_code():
            pass  # raised once only


def test_a_signal_between_programs_is_dropped(gate) -> None:
    with gate.program():
        pass
    interrupt_self()  # after the program: meant for it, too late
    with gate.program():
        interrupt_self()  # in the program's own code at its very end: dropped with it
    with gate.program(), gate.user_code():
        ran = True
    assert ran and not gate.pending
