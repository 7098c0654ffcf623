"""Earlier runs' folders in ``<log-dir>/runs/`` (SERVER §13): each start of a server makes
one, holding up to ``--log-programs-max-bytes`` of programs and ``--log-events-max-bytes``
of events, so without a bound a server restarted often (a pod's container, a systemd unit,
a crash loop) fills its disk a run at a time. ``--log-runs-max`` keeps the newest runs.

A run in use is never removed: its server holds a shared ``flock`` on the run folder for
its life (``hold``), and a folder is removed only under an exclusive one taken without
waiting. The kernel drops the lock when the server ends, however it ends. A server locks
its folder before it makes ``events.jsonl`` there, so a folder without one may be a server's
that has not locked it yet: kept while it was named less than ``YOUNG_SECONDS`` ago.
A server of a release before this bound holds no lock: do not share a log folder with one.

Who can reach ``runs/``: the server's own user (it is 0700). Only folders whose name is a
run's (``run_dir_name``) are considered; a link is never followed (``rmtree`` removes a
link inside a run, not what it points to)."""

from __future__ import annotations

import calendar
import fcntl
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

#: ``YYYYMMDDTHHMMSS.ffffffZ`` with an optional ``-N`` (``event_log.run_dir_name``)
RUN_NAME = re.compile(r"(\d{8}T\d{6})\.\d{6}Z(?:-\d+)?")
#: a run folder named less than this long ago and without ``EVENTS`` may not be locked yet
YOUNG_SECONDS = 60.0
EVENTS = "events.jsonl"


def hold(run_dir: Path) -> int:
    """Open ``run_dir`` and take the shared lock that marks it in use; the descriptor is
    the caller's to keep open for the run's life (closing it releases the lock)."""
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


@dataclass
class RemovedRuns:
    removed: list[str] = field(default_factory=list)
    in_use: list[str] = field(default_factory=list)  # past the bound but held by a server
    failed: dict[str, str] = field(default_factory=dict)  # name -> why it stayed


def _named_at(name: str) -> float:
    match = RUN_NAME.fullmatch(name)
    assert match is not None
    return float(calendar.timegm(time.strptime(match.group(1), "%Y%m%dT%H%M%S")))


def _run_folders(runs: Path) -> list[str]:
    """The names in ``runs`` that are run folders (not links), oldest first."""
    names = []
    for entry in os.scandir(runs):
        if RUN_NAME.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
            names.append(entry.name)
    # the name is the start time; "-N" (two starts in one microsecond) sorts after its base
    return sorted(names)


def remove_old_runs(runs: Path, keep: int, now: float | None = None) -> RemovedRuns:
    """Remove the run folders of ``runs`` older than the newest ``keep`` (the caller's own
    among them) that no server holds and that are not young; ``keep`` 0 removes nothing."""
    result = RemovedRuns()
    if keep <= 0:
        return result
    now = time.time() if now is None else now
    names = _run_folders(runs)
    for name in names[: max(0, len(names) - keep)]:
        path = runs / name
        if now - _named_at(name) < YOUNG_SECONDS and not os.path.lexists(path / EVENTS):
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            result.failed[name] = exc.strerror or type(exc).__name__
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                result.in_use.append(name)
                continue
            # under the exclusive lock: another server's clean-up of the same folder now
            # finds it held and leaves it
            shutil.rmtree(path)
            result.removed.append(name)
        except FileNotFoundError:
            continue  # gone meanwhile (removed by hand)
        except OSError as exc:
            result.failed[name] = exc.strerror or type(exc).__name__
        finally:
            os.close(fd)
    return result
