"""A pool's seats and which idle one a request gets (server/kcoral_server/pool/seat.py, SERVER.md
§4)."""

from __future__ import annotations

from kcoral_server.pool.seat import GpuDevice, Seat, SeatState, least_loaded_idle, seats_for


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
    chosen = least_loaded_idle(seats)
    assert chosen is not None and chosen.gpu_id == 1


def test_no_seat_is_chosen_when_none_is_idle() -> None:
    seats = [Seat("cpu/w0", None, state=SeatState.BUSY), Seat("cpu/w1", None)]
    assert least_loaded_idle(seats) is None
