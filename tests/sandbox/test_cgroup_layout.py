"""The cgroup v2 layout of a front-end and its workers (issue 28 point 6), on a stand-in
cgroup filesystem.

CI's machines mount the memory controller as cgroup v1, where the server tests of
``test_memory_share`` run for real; the v2 branch (moving the front-end into a leaf, the
workers' parent with the limit, worker cgroups under it) is checked here against a small
stand-in of the kernel's rules: a non-root cgroup that holds processes cannot hand
controllers to children ("no internal processes"), and writing a pid into ``cgroup.procs``
moves that process.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kcoral_server.processes import cgroups, limits

INTERFACE = ("cgroup.procs", "cgroup.subtree_control", "memory.max", "pids.max")


class FakeCgroupFs:
    """A directory tree that behaves like cgroupfs for what ``limits`` writes."""

    def __init__(self, root: Path, own: str, pids: list[int]) -> None:
        self.root = root
        self.own = own
        self.make(root)
        self.make(root / own.lstrip("/"))
        (root / own.lstrip("/") / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))

    def make(self, path: Path) -> None:
        os.makedirs(path, exist_ok=True)
        (path / "cgroup.controllers").write_text("memory pids\n")
        for name in INTERFACE:
            if not (path / name).exists():
                (path / name).write_text("")

    def procs(self, path: Path) -> list[str]:
        return (path / "cgroup.procs").read_text().split()

    def write(self, path: Path, text: str) -> bool:
        cgroup = path.parent
        if path.name == "cgroup.subtree_control":
            if cgroup != self.root and self.procs(cgroup):
                return False  # EBUSY: no internal processes
            enabled = set(path.read_text().split()) | {text.lstrip("+")}
            path.write_text(" ".join(sorted(enabled)))
            return True
        if path.name == "cgroup.procs":
            if cgroup != self.root and (cgroup / "cgroup.subtree_control").read_text().split():
                return False  # EBUSY: a cgroup that hands controllers holds no process
            for other in self.root.rglob("cgroup.procs"):
                other.write_text("".join(f"{p}\n" for p in self.procs(other.parent) if p != text))
            path.write_text(path.read_text() + f"{text}\n")
            return True
        path.write_text(text)
        return True


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeCgroupFs:
    own = "/system.slice/kcoral-node.service"
    fs = FakeCgroupFs(tmp_path / "cgroup", own, [os.getpid(), 4242])  # 4242: the supervisor
    real_mkdir = Path.mkdir

    def mkdir(self: Path, mode: int = 0o777, parents: bool = False, exist_ok: bool = False):
        real_mkdir(self, mode, parents, exist_ok)
        if fs.root in self.parents:
            fs.make(self)  # the kernel fills a new cgroup with its interface files

    monkeypatch.setattr(Path, "mkdir", mkdir)
    monkeypatch.setattr(cgroups, "_write", fs.write)
    monkeypatch.setattr(cgroups, "_cgroup2_mount", lambda: fs.root)
    monkeypatch.setattr(cgroups, "_own_cgroups", lambda: {"": own})
    monkeypatch.setattr(cgroups, "_trees", {})
    monkeypatch.setattr(cgroups, "_ceilings", {os.getpid(): 0})
    monkeypatch.setattr(cgroups.atexit, "register", lambda *_: None)
    return fs


def test_the_front_end_moves_into_a_leaf_and_workers_sit_under_one_limited_parent(
    fake: FakeCgroupFs,
) -> None:
    service = fake.root / fake.own.lstrip("/")
    wanted = limits.WorkerLimits(1 << 30, 64, all_workers_memory_bytes=3 << 30)
    cgroup = cgroups.create_cgroup(wanted)
    leaf = service / cgroups.FRONT_END_LEAF
    tree = service / f"{cgroups.TREE_PREFIX}{os.getpid()}"
    # every process of the unit (front-end and supervisor) now lives in the leaf
    assert fake.procs(service) == []
    assert sorted(fake.procs(leaf)) == sorted([str(os.getpid()), "4242"])
    assert (service / "cgroup.subtree_control").read_text().split() == ["memory", "pids"]
    assert (tree / "memory.max").read_text() == str(3 << 30)
    assert (tree / "cgroup.subtree_control").read_text().split() == ["memory", "pids"]
    assert [p.parent for p in cgroup.paths] == [tree]
    assert cgroup.memory_bytes == 1 << 30 and cgroup.processes == 64
    assert (cgroup.paths[0] / "memory.max").read_text() == str(1 << 30)
    assert (cgroup.paths[0] / "memory.oom.group").read_text() == "1"
    # a worker can enter its cgroup (the parent holds no process itself)
    assert cgroups._write(cgroup.paths[0] / "cgroup.procs", "777")


def test_a_cgroup_shared_with_processes_it_cannot_move_leaves_v2_limits_unenforced(
    fake: FakeCgroupFs, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = fake.root / fake.own.lstrip("/")
    real_write = fake.write

    def stuck(path: Path, text: str) -> bool:
        if path.name == "cgroup.procs" and text == "4242":
            return False  # not ours to move (another user's process)
        return real_write(path, text)

    monkeypatch.setattr(cgroups, "_write", stuck)
    wanted = limits.WorkerLimits(1 << 30, 64, memory_cgroup_only=True)
    assert cgroups.create_cgroup(wanted).paths == []
    assert cgroups.unenforced(wanted) == ["memory", "processes"]
    assert fake.procs(service) == ["4242"]


def test_a_killed_front_ends_parent_and_its_empty_worker_cgroups_are_removed(
    fake: FakeCgroupFs,
) -> None:
    service = fake.root / fake.own.lstrip("/")
    dead = service / f"{cgroups.TREE_PREFIX}999999999"
    # plain directories: the stand-in's interface files would keep rmdir from working
    os.makedirs(dead / f"{cgroups.CGROUP_PREFIX}999999999-abc")
    live = service / f"{cgroups.TREE_PREFIX}{os.getpid()}"
    os.makedirs(live / f"{cgroups.CGROUP_PREFIX}{os.getpid()}-abc")
    assert cgroups.remove_stale_cgroups() == 2
    assert not dead.exists() and live.exists()


def test_a_memory_limit_above_the_front_end_is_the_machine_the_workers_share(
    fake: FakeCgroupFs, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a container's or a systemd slice's MemoryMax: the workers' memory is what it leaves
    slice_dir = fake.root / "system.slice"
    (slice_dir / "memory.max").write_text(str(8 * limits.GIB))
    (fake.root / fake.own.lstrip("/") / "memory.max").write_text("max")
    monkeypatch.setattr(cgroups, "_ceilings", {})
    assert cgroups._own_memory_ceiling() == 8 * limits.GIB
    reserve = limits.memory_reserve(8 * limits.GIB, limits.GIB)
    assert limits.workers_memory_bytes(limits.GIB) == 8 * limits.GIB - reserve
