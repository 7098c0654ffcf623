"""Processes a program left behind that its worker's own clean-up did not see (SERVER §8).

The worker kills its descendants at each program's end (``worker.reaper``), but it finds
them as a child subreaper, and a program can switch that flag off
(``prctl(PR_SET_CHILD_SUBREAPER, 0)``): a double fork then re-parents the grandchild to
whoever is above the worker (the launcher, its supervisor, bubblewrap's init), where the
worker never looks, and it ran on until the session or the server ended. Whatever runs in
the worker process can be undone by the program, so the front-end looks as well, after
``ProgramFinished`` and before the lease and the seat are handed on, from places the program
cannot change:

* the worker's cgroup (``cgroups.WorkerCgroup``, on by default where cgroups can be written):
  no process leaves it on its own, whoever its parent becomes. One read of its
  ``cgroup.procs``; the processes in it when the worker became ready (the worker and what
  launches it: the cgroup shim's ``bwrap``, the supervisor) are the worker's own.
* without a cgroup, the process tree above the worker, which stays a subreaper the program
  cannot switch off: a spawned worker's supervisor or ``bwrap`` (its PID namespace and
  init), a forked worker's launcher. Every process below that root that was not there when
  the worker became ready is the program's, except the worker's own descendants, which
  its reaper has just killed (the walk does not descend into the worker: it has a
  ``children`` file per thread, dozens with torch's pools). Among a shared launcher's
  children, its other workers and what belongs to their process sessions (the SID a
  program's descendants keep unless they call ``setsid``) are left to those workers' own
  checks, so an orphan that left every process session is blamed on the program whose
  check finds it.

What is found is killed (``SIGKILL`` through pidfds) and the program fails as for any
leftover descendant; the worker then retires, and its confinement's removal kills whatever
is left. The happy path costs one ``cgroup.procs`` read, or a few ``/proc/*/children``
reads, and never sleeps.
"""

from __future__ import annotations

import time

from kcoral_server.processes import procfs
from kcoral_server.processes.cgroups import WorkerCgroup
from kcoral_server.processes.launcher.front_end import ForkedProcess, Forks

__all__ = ["StrayWatch", "stray_watch"]

#: how long ``kill`` keeps killing (a program's process may still be forking)
KILL_SECONDS = 5.0
KILL_POLL_SECONDS = 0.01


class StrayWatch:
    """Where one worker's stray processes can be found, learnt when it became ready.

    Exactly one way is used: the ``cgroup`` when it has paths; else the tree below
    ``root`` (a spawned worker's supervisor or ``bwrap``); else the worker's own tree plus
    its ``launcher``'s children (a forked worker's parent) except the other workers in
    ``forks`` and their process sessions."""

    def __init__(
        self,
        worker: int,
        *,
        cgroup: WorkerCgroup | None = None,
        root: int | None = None,
        forks: Forks | None = None,
    ) -> None:
        self.worker = worker  # host pid: the worker (forked) or the root of its tree
        self.cgroup = cgroup if cgroup is not None and cgroup.paths else None
        self.root = root
        self.forks = forks
        # only the walk without a cgroup asks for these (two /proc reads per worker)
        walks = self.cgroup is None
        self.launcher = procfs.parent(worker) if walks and forks is not None else None
        self.sid = procfs.sid(worker) if walks else None
        #: the tree's processes without children when the worker became ready: the worker
        #: itself, whose descendants are its reaper's (``_members`` does not walk them)
        self.leaves: set[int] = set()
        if self.cgroup is None and root is not None:
            tree = [root, *procfs.descendants(root)]
            self.leaves = {pid for pid in tree if not procfs.children(pid)}
        self.own: set[int] = set(self._members())  # the worker and what launched it

    def _members(self) -> list[int]:
        """Every process that counts as this worker's now (its own ones included)."""
        if self.cgroup is not None:
            return self.cgroup.pids()
        if self.root is not None:
            return self._below(self.root)
        found = [self.worker]
        if self.launcher is None or self.forks is None:
            return found
        orphans = procfs.children(self.launcher)
        # Asked in this order: a worker among those children is in ``live`` once settled.
        settled = self.forks.settled
        others = self.forks.live() - {self.worker}
        for pid in orphans:
            if pid == self.worker or pid in others:
                continue
            sid = procfs.sid(pid)
            if sid in others:
                continue  # another worker's program's: that worker's check finds it
            # An orphan that left every process session: ours, unless it may be a worker being
            # forked right now (that one is not in ``live`` yet).
            if sid == self.sid or settled:
                found += [pid, *procfs.descendants(pid)]
        return found

    def _below(self, root: int) -> list[int]:
        """``root`` and the processes below it, without walking below ``leaves``."""
        found = [root]
        pending = [root]
        while pending:
            pid = pending.pop()
            if pid in self.leaves:
                continue
            for child in procfs.children(pid):
                if child not in found:
                    found.append(child)
                    pending.append(child)
        return found

    def find(self) -> list[int]:
        """Live processes of the worker's that it did not have when it became ready."""
        return [pid for pid in self._members() if pid not in self.own and procfs.is_alive(pid)]

    def kill(self, found: list[int]) -> list[int]:
        """Kill ``found`` and whatever strays appear meanwhile (blocking: run it in a
        thread); returns every stray that was seen."""
        seen = list(found)
        deadline = time.monotonic() + KILL_SECONDS
        while found:
            for pid in found:
                procfs.kill_process(pid)
            if time.monotonic() > deadline:
                break  # the worker retires: its confinement's removal tries again
            time.sleep(KILL_POLL_SECONDS)
            found = self.find()
            seen += [pid for pid in found if pid not in seen]
        return seen


def stray_watch(process: object, cgroup: WorkerCgroup | None) -> StrayWatch:
    """The watch for a worker ``process`` that just became ready (a ``ForkedProcess``, or
    the ``Popen`` of its supervisor or ``bwrap``)."""
    pid = process.pid  # type: ignore[attr-defined]
    if isinstance(process, ForkedProcess):
        return StrayWatch(pid, cgroup=cgroup, forks=process.forks)  # None: its own tree
    return StrayWatch(pid, cgroup=cgroup, root=pid)
