"""The router's systemd unit and pod give its ``--stop-grace-seconds`` room and say what a
stop does (ROUTER §11). Both said the router stopped at once on SIGTERM, its requests in
flight failing, which a9a620e made untrue: programs get 20 s to finish."""

from __future__ import annotations

import configparser
import dataclasses

from deploy_files import SYSTEMD, resource
from kcoral_server.router.main import CALLS_END_SECONDS
from kcoral_server.router.settings import RouterSettings

ROUTER_POD = SYSTEMD.parent / "kubernetes" / "router.yaml"


def default_stop_grace() -> float:
    field = next(f for f in dataclasses.fields(RouterSettings) if f.name == "stop_grace_seconds")
    return float(field.default)


def test_the_router_unit_waits_out_the_stop_grace_and_says_programs_get_it() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    text = (SYSTEMD / "kcoral-router.service").read_text()
    unit.read_string(text)
    command = unit["Service"]["ExecStart"]
    assert "--stop-grace-seconds" not in command  # the default below is the one used
    stop_timeout = float(unit["Service"]["TimeoutStopSec"])
    assert stop_timeout > default_stop_grace() + CALLS_END_SECONDS
    assert "stops at once" not in text and "--stop-grace-seconds" in text


def test_the_router_pod_waits_out_the_stop_grace_and_says_programs_get_it() -> None:
    spec = resource("Deployment", "kcoral-router")["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] > default_stop_grace() + CALLS_END_SECONDS
    assert not any(
        "--stop-grace-seconds" in arg for c in spec["containers"] for arg in c["command"]
    )
    text = ROUTER_POD.read_text()
    assert "stops at once" not in text and "--stop-grace-seconds" in text
