"""A CPU benchmark's "other processes" warning counts the measurement's neighbours, never
the measurement itself (EXTENSIONS §12.4): the load average it replaced counted the
measuring process, so a benchmark of a few seconds on 2 CPUs warned about itself."""

from __future__ import annotations

import os

import pytest

from kcoral.bench import cpu_share
from kcoral.builtins import benchmark


class StandInCpus:
    """/proc/stat and the process's own CPU time as a test sets them: every ``tick()``
    advances the wall clock by ``span`` and the machine by the process's own ``own``
    seconds plus ``others`` seconds of other processes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, own: float, others: float) -> None:
        self.now = self.machine = self.self_time = 0.0
        self.own, self.others = own, others
        monkeypatch.setattr(cpu_share, "_machine_busy_seconds", lambda _cpus: self.machine)
        monkeypatch.setattr(cpu_share, "_own_seconds", lambda: self.self_time)
        monkeypatch.setattr(cpu_share, "monotonic", self.monotonic)

    def monotonic(self) -> float:
        # each reading of the clock is one second later, the machine busy meanwhile
        self.now += 1.0
        self.machine += self.own + self.others
        self.self_time += self.own
        return self.now


def on_cpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """A machine of ``count`` CPUs, all of which the measurement may use."""
    monkeypatch.setattr(os, "cpu_count", lambda: count)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(count)))


def cpu_warnings_of(result: dict) -> list[str]:
    return [w for w in result["warnings"] if "other processes" in w or "load average" in w]


def test_a_measurement_that_keeps_a_cpu_busy_itself_draws_no_warning_on_two_cpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_cpus(monkeypatch, 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.9, 1.2, 0.6))  # its own load, mostly
    StandInCpus(monkeypatch, own=1.0, others=0.1)
    result = benchmark(lambda: None, {"warmup": 1, "repeat": 5})
    assert result["machine"]["others_busy_cpus"] == pytest.approx(0.1)
    assert cpu_warnings_of(result) == []


def test_other_processes_busy_on_the_spare_cpu_are_named_with_their_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_cpus(monkeypatch, 2)
    StandInCpus(monkeypatch, own=1.0, others=0.8)
    result = benchmark(lambda: None, {"warmup": 1, "repeat": 5})
    assert cpu_warnings_of(result) == [
        "other processes kept 0.8 of the 2 CPUs it may use busy during the measurement"
    ]


def test_a_busy_neighbour_on_a_large_machine_warns_only_past_half_the_spare_cpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_cpus(monkeypatch, 16)
    StandInCpus(monkeypatch, own=1.0, others=3.0)
    assert cpu_warnings_of(benchmark(lambda: None, {"repeat": 5})) == []
    StandInCpus(monkeypatch, own=1.0, others=8.0)
    assert cpu_warnings_of(benchmark(lambda: None, {"repeat": 5})) == [
        "other processes kept 8 of the 16 CPUs it may use busy during the measurement"
    ]


def test_a_span_too_short_to_tell_or_no_proc_stat_reports_the_share_as_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    share = cpu_share.CpuShare(machine_busy=None, own=0.0, started=0.0)
    assert share.others_busy_cpus() is None
    monkeypatch.setattr(cpu_share, "_machine_busy_seconds", lambda _cpus: 100.0)
    assert cpu_share.CpuShare.start().others_busy_cpus() is None  # 0 s: too short


def test_the_share_is_read_from_this_linux_machine_for_a_real_measurement() -> None:
    share = cpu_share.CpuShare.start()
    share = cpu_share.CpuShare(share.machine_busy, share.own, share.started - 1.0)
    others = share.others_busy_cpus()
    assert others is not None and 0.0 <= others <= (os.cpu_count() or 1)


def test_only_the_cpus_the_measurement_may_use_are_counted(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    # a worker pinned to CPUs 2-3 of a node whose CPUs 0-1 are busy with another worker's
    # benchmark: those never compete with it (review: the whole machine was counted)
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  900 0 0 100 0 0 0 0 0 0\n"
        "cpu0 400 0 0 0 0 0 0 0 0 0\ncpu1 400 0 0 0 0 0 0 0 0 0\n"
        "cpu2 50 0 0 50 0 0 0 0 0 0\ncpu3 50 0 0 50 0 0 0 0 0 0\nintr 1\n"
    )
    real_open = open
    monkeypatch.setattr(
        "builtins.open",
        lambda path, *a, **k: real_open(stat if path == "/proc/stat" else path, *a, **k),
    )
    ticks = os.sysconf("SC_CLK_TCK")
    assert cpu_share._machine_busy_seconds(frozenset({2, 3})) == 100 / ticks
    assert cpu_share._machine_busy_seconds(None) == 900 / ticks
    assert cpu_share._machine_busy_seconds(frozenset({7})) is None  # not in /proc/stat
