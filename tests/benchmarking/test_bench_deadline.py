"""What the benchmark helpers know of their program's deadline (``kcoral.bench.deadline``,
EXTENSIONS §12.1): nothing outside a worker, the seconds the front-end sent, and those
moved later by the worker's wait for its GPU lease, which the front-end's deadline does not
count (SERVER §8). The whole path, a real server cutting a benchmark short, is
``test_a_benchmark_cut_by_its_deadline.py``."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from kcoral_server.processes.ipc import BlockingChannel, LeaseAcquire, LeaseGranted
from kcoral_server.worker.leasing import Lease

from kcoral.bench.deadline import DeadlineWatch, set_program_deadline

#: How long the stand-in front-end keeps the lease from the worker, in seconds: longer
#: than the deadline, so a wait the deadline counted would leave it passed.
LEASE_WAIT = 2.5


@pytest.fixture(autouse=True)
def no_program_after() -> Iterator[None]:
    yield
    set_program_deadline(None)


def test_without_a_program_deadline_nothing_is_near() -> None:
    set_program_deadline(None)
    assert not DeadlineWatch().near()


def test_a_deadline_within_the_margin_is_near_and_says_it_cut() -> None:
    set_program_deadline(0.2)  # inside the 0.5 s margin
    watch = DeadlineWatch()
    assert watch.near() and watch.cut
    assert watch.margin == pytest.approx(0.52)


def test_the_margin_grows_with_the_deadline_up_to_five_seconds() -> None:
    set_program_deadline(3000)
    assert DeadlineWatch().margin == 5.0


def test_a_wait_for_the_gpu_lease_moves_the_deadline_later() -> None:
    worker_end, front_end = socket.socketpair()
    front = BlockingChannel(front_end)

    def grant_late() -> None:
        message, _fds = front.receive()
        assert isinstance(message, LeaseAcquire)
        time.sleep(LEASE_WAIT)
        front.send(LeaseGranted())

    granter = threading.Thread(target=grant_late)
    granter.start()
    try:
        set_program_deadline(2.0)
        Lease(BlockingChannel(worker_end), enabled=True).acquire()
        # 2 s of deadline, all still left: the wait was not counted
        assert not DeadlineWatch().near()
    finally:
        granter.join()
        worker_end.close()
        front_end.close()
