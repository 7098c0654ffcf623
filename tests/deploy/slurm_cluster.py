"""A real one-machine Slurm for tests: munged, slurmctld and slurmd as child processes, each
with its own configuration, key, sockets, ports and state under a temporary folder.

No cgroups are needed (``proctrack/linuxproc``, ``task/none``, ``jobacct_gather/none``,
``select/cons_tres`` with ``CR_CPU``); ``SlurmUser=root``, since the test runs as root (CI).
Without accounting there is no ``sacct``: job states come from ``squeue`` and
``scontrol show job``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")
NODE_NAME = "kcnode"
PARTITION = "kctest"
GRES_TYPE = "tiny"
#: what the test's node jobs pass to ``kcoral server`` after the script's own options (and
#: docs/scaling.md "Slurm" with them): no sandbox and reused workers keep two cores light
NODE_OPTIONS = ("--sandbox", "none", "--max-requests-per-worker", "0")


def missing_programs() -> list[str]:
    """The Slurm and munge programs this machine lacks (Debian: slurmctld slurmd munge
    slurm-client)."""
    found = {
        name: shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin") for name in PROGRAMS
    }
    return [name for name, path in found.items() if path is None]


def program(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    assert path is not None, name
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class SlurmCluster:
    """One controller and one node (``kcnode``, 2 CPUs, one ``gpu:tiny`` GRES) in partition
    ``kctest``."""

    root: Path
    cpus: int = 2
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default this process's environment) with ``SLURM_CONF`` set."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def write_files(self) -> None:
        for folder in ("state", "spool", "munge"):
            (self.root / folder).mkdir(mode=0o700, parents=True, exist_ok=True)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        # One typed GPU GRES with no GPU behind it (/dev/null): enough for Slurm to hand a
        # job SLURM_JOB_GPUS and show its type, which is all the batch script reads.
        gres = f"NodeName={NODE_NAME} Name=gpu Type={GRES_TYPE} File=/dev/null\n"
        (self.root / "gres.conf").write_text(gres)
        root = self.root
        host = socket.gethostname().split(".")[0]
        node = (
            f"NodeName={NODE_NAME} NodeAddr=127.0.0.1 NodeHostname={host} CPUs={self.cpus} "
            f"Gres=gpu:{GRES_TYPE}:1 State=UNKNOWN"
        )
        self.conf.write_text(
            f"""\
ClusterName=kcoraltest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
MailProg=/bin/true
KillWait=30
GresTypes=gpu
{node}
PartitionName={PARTITION} Nodes={NODE_NAME} Default=YES MaxTime=INFINITE State=UP
"""
        )

    def start(self) -> None:
        self.write_files()
        munge = self.root / "munge"
        self._daemon(
            program("munged"),
            "--foreground",
            "--force",
            f"--socket={munge}/munge.socket",
            f"--key-file={munge}/munge.key",
            f"--pid-file={munge}/munged.pid",
            f"--seed-file={munge}/munged.seed",
            f"--log-file={munge}/munged.log",
            log="munged.out",
        )
        self._wait(lambda: (munge / "munge.socket").exists(), "munged made no socket")
        self._daemon(program("slurmctld"), "-D", "-i", "-f", str(self.conf), log="slurmctld.out")
        self._wait(self._controller_answers, "slurmctld does not answer")
        self._daemon(
            program("slurmd"), "-D", "-N", NODE_NAME, "-f", str(self.conf), log="slurmd.out"
        )
        self._wait(lambda: self.node_state() in ("IDLE", "MIXED"), "the node never got idle")

    def _daemon(self, *command: str, log: str) -> None:
        with open(self.root / log, "wb") as out:
            process = subprocess.Popen(
                list(command),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,
            )
        self.daemons.append(process)

    def _wait(self, ready: object, problem: str, timeout: float = 60) -> None:
        assert callable(ready)
        deadline = time.monotonic() + timeout
        while not ready():
            for daemon in self.daemons:
                if daemon.poll() is not None:
                    raise AssertionError(f"{daemon.args[0]} exited: {self.logs()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{problem}: {self.logs()}")
            time.sleep(0.2)

    def _controller_answers(self) -> bool:
        return self.run("scontrol", "ping", check=False).returncode == 0

    def logs(self) -> str:
        texts = []
        for name in ("munged.out", "munge/munged.log", "slurmctld.log", "slurmd.log"):
            path = self.root / name
            if path.exists():
                texts.append(f"--- {name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(texts)

    def run(
        self, *command: str, check: bool = True, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster."""
        return subprocess.run(
            [program(command[0]), *command[1:]],
            capture_output=True,
            text=True,
            env=self.environment(env),
            check=check,
            timeout=60,
        )

    def node_state(self) -> str:
        answer = self.run("scontrol", "show", "node", NODE_NAME, check=False).stdout
        for word in answer.split():
            if word.startswith("State="):
                return word.split("=", 1)[1].split("+")[0]
        return ""

    def job_state(self, job: str) -> str:
        """``RUNNING``, ``COMPLETED``, ... from ``scontrol show job`` (kept for MinJobAge)."""
        answer = self.run("scontrol", "show", "job", job, check=False).stdout
        for word in answer.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        return ""

    def job_field(self, job: str, name: str) -> str:
        answer = self.run("scontrol", "show", "job", job, check=False).stdout
        for word in answer.split():
            if word.startswith(f"{name}="):
                return word.split("=", 1)[1]
        return ""

    def jobs_left(self) -> bool:
        answer = self.run("squeue", "--noheader", "--states=all", check=False)
        states = [line.split()[4] for line in answer.stdout.splitlines() if line.split()]
        return answer.returncode == 0 and any(state in ("R", "PD", "CG") for state in states)

    def stop(self) -> None:
        """Cancel every job, stop the daemons and leave no process of theirs behind."""
        if self.daemons and all(daemon.poll() is None for daemon in self.daemons):
            self.run("scancel", "--full", "--partition", PARTITION, check=False)
            # Let the jobs' slurmstepd end with them before their slurmd goes.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and self.jobs_left():
                time.sleep(0.5)
        for daemon in reversed(self.daemons):
            stop_tree(daemon)


def stop_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM ``process`` and its descendants, SIGKILL what is left after 20 s."""
    try:
        family = [psutil.Process(process.pid), *psutil.Process(process.pid).children(True)]
    except psutil.NoSuchProcess:
        family = []
    for member in family:
        try:
            member.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(family, timeout=20)
    for member in alive:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10)
    if process.poll() is None:
        process.kill()
    process.wait()


@contextmanager
def slurm_cluster(root: Path, cpus: int = 2) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(root, cpus)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def sbatch(
    cluster: SlurmCluster,
    script: Path,
    options: Sequence[str],
    script_args: Sequence[str],
    env: Mapping[str, str],
) -> str:
    """``sbatch OPTIONS SCRIPT SCRIPT_ARGS``; the job id."""
    answer = cluster.run(
        "sbatch", "--parsable", *options, str(script), *script_args, env=env, check=False
    )
    assert answer.returncode == 0, answer.stderr + cluster.logs()
    return answer.stdout.strip().split(";")[0]
