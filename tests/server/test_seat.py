"""A pool's seats and which idle one a request gets (server/kcoral_server/pool/seat.py, SERVER.md
§4)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

from kcoral_server.pool.seat import GpuDevice, Seat, SeatState, seat_to_take, seats_for
from kcoral_server.processes.handle import WorkerHandle


def test_cpu_mode_has_num_workers_seats_and_gpu_mode_workers_per_gpu_on_each_gpu() -> None:
    assert [s.id for s in seats_for("cpu", [], 2, 8)] == ["cpu/w0", "cpu/w1"]
    gpu_seats = seats_for("gpu", [GpuDevice(3), GpuDevice(5)], 1, 2)
    assert [(s.id, s.gpu_id) for s in gpu_seats] == [
        ("gpu3/w0", 3),
        ("gpu3/w1", 3),
        ("gpu5/w0", 5),
        ("gpu5/w1", 5),
    ]
    assert all(s.state is SeatState.STARTING and s.generation == 0 for s in gpu_seats)


def test_a_request_gets_an_idle_seat_on_the_gpu_with_the_fewest_requests() -> None:
    seats = seats_for("gpu", [GpuDevice(0), GpuDevice(1)], 1, 2)
    for seat in seats:
        seat.state = SeatState.IDLE
    seats[0].state, seats[0].assigned = SeatState.BUSY, True  # GPU 0 runs one request
    chosen = seat_to_take(seats)
    assert chosen is not None and chosen.gpu_id == 1


def test_no_seat_is_chosen_when_none_is_idle() -> None:
    seats = [Seat("cpu/w0", None, state=SeatState.BUSY), Seat("cpu/w1", None)]
    assert seat_to_take(seats) is None


def _two_gpus_one_busy() -> list[Seat]:
    """GPU 0 runs a request on w0 (its lease held) and has w1 idle."""
    seats = seats_for("gpu", [GpuDevice(0), GpuDevice(1)], 1, 2)
    seats[0].state, seats[0].assigned = SeatState.BUSY, True
    seats[1].state = SeatState.IDLE
    return seats


def test_a_request_waits_for_a_free_gpus_seat_being_replaced_not_a_busy_gpus_lease() -> None:
    seats = _two_gpus_one_busy()
    seats[2].state = seats[3].state = SeatState.REPLACING  # GPU 1: new workers coming
    assert seat_to_take(seats) is None
    seats[2].state = SeatState.BUSY  # GPU 1's w0 cleaning up after its program
    seats[3].state = SeatState.STARTING
    assert seat_to_take(seats) is None
    seats[3].state = SeatState.IDLE  # one is ready: it is taken
    assert seat_to_take(seats) is seats[3]


def test_a_busy_gpus_idle_seat_is_taken_when_no_freer_gpus_seat_is_about_to_be_ready() -> None:
    seats = _two_gpus_one_busy()
    seats[2].state = seats[3].state = SeatState.FAILED  # backing off: not about to be ready
    assert seat_to_take(seats) is seats[1]
    seats[2].state, seats[2].assigned = SeatState.BUSY, True  # GPU 1 as busy as GPU 0
    seats[3].state = SeatState.REPLACING
    assert seat_to_take(seats) is seats[1]
    seats[2].assigned = False
    assert seat_to_take(seats, handed=[seats[2]]) is seats[1]  # just handed: as busy


def test_seats_handed_over_count_as_taken_and_as_load() -> None:
    seats = seats_for("gpu", [GpuDevice(0), GpuDevice(1)], 1, 2)
    for seat in seats:
        seat.state = SeatState.IDLE
    first = seat_to_take(seats)
    assert first is seats[0]
    second = seat_to_take(seats, handed=[first])
    assert second is not None and second.gpu_id == 1
    third = seat_to_take(seats, handed=[first, second])
    assert third is seats[1]


def _worker_forked_after(*modules: str) -> WorkerHandle:
    """A stand-in for a worker whose launcher had preloaded ``modules`` when it forked it."""
    return cast(WorkerHandle, SimpleNamespace(process=SimpleNamespace(preloaded=modules)))


def test_of_two_idle_seats_the_one_whose_worker_has_torch_preloaded_is_taken() -> None:
    seats = seats_for("cpu", [], 2, 1)
    for seat in seats:
        seat.state = SeatState.IDLE
    seats[0].worker = _worker_forked_after()  # forked before its launcher's preload
    seats[1].worker = _worker_forked_after("torch")
    assert seat_to_take(seats) is seats[1]
    seats[0].worker = _worker_forked_after("torch")  # equals: the first, as before
    assert seat_to_take(seats) is seats[0]


def test_a_preloaded_worker_does_not_outrank_a_less_loaded_gpu() -> None:
    seats = _two_gpus_one_busy()  # GPU 0 runs a request; its w1 is idle and preloaded
    seats[1].worker = _worker_forked_after("torch")
    seats[2].state = SeatState.IDLE
    seats[2].worker = _worker_forked_after()
    assert seat_to_take(seats) is seats[2]
