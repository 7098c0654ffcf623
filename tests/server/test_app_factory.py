"""``kcoral.create_app`` builds an application without starting workers."""

from __future__ import annotations

import pytest
from kcoral_server.settings.config import ServerConfig

import kcoral


def test_create_app_builds_an_application_and_starts_nothing(tmp_path) -> None:
    app = kcoral.create_app(
        ServerConfig(device="cpu", sandbox="none", disk_cache_dir=tmp_path / "disk")
    )
    assert app.state.pool.request_capacity == 0
    assert all(seat.worker is None for seat in app.state.pool.seats)
    assert app.state.health()["gpu_count"] == 0


def test_create_app_refuses_an_invalid_config() -> None:
    with pytest.raises(ValueError):
        kcoral.create_app(ServerConfig(device="tpu"))


def test_create_app_bounds_its_stored_programs_as_configured(tmp_path) -> None:
    app = kcoral.create_app(
        ServerConfig(
            device="cpu",
            sandbox="none",
            disk_cache_dir=tmp_path / "disk",
            log_dir=tmp_path / "logs",
            log_programs_max_bytes=1 << 20,
        )
    )
    try:
        assert app.state.events.record_program("a", b"x" * (2 << 20)) is None  # over the bound
        assert app.state.events.record_program("b", b"{}") == "b.json"
    finally:
        app.state.events.close()
