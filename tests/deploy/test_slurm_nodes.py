"""KCoral nodes as Slurm jobs (issue 33, point 5), on a real one-machine Slurm.

munged, slurmctld and slurmd run as child processes (``slurm_cluster``); a real router takes
per-node tokens (``slurm-* TOKEN``); two CPU-mode node jobs are submitted with the real batch
script, ``deploy/slurm/kcoral-node.sbatch``, exactly as ``docs/scaling.md`` "Slurm" types
it; programs run through the router; one node is drained while a program runs on it
(``scancel --batch --signal=TERM``, the signal ``#SBATCH --signal=B:TERM@600`` sends before
the time limit): the program completes, the node leaves, the other keeps serving, and both
jobs end ``COMPLETED`` with exit code 0. Nothing is left running afterwards.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
from itertools import pairwise
from pathlib import Path
from typing import Any

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from router_helpers import RouterProcess, http_request, start_router
from slurm_cluster import (
    GRES_TYPE,
    NODE_OPTIONS,
    PARTITION,
    SlurmCluster,
    missing_programs,
    sbatch,
    slurm_cluster,
)
from waiting import wait_for

import kcoral

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "slurm" / "kcoral-node.sbatch"
NODE_TOKEN = "token-of-the-slurm-service-account"
#: how long a step of a node's life may take on a loaded machine
WAIT_SECONDS = 120.0
#: a question costs a process (scontrol) or a walk of the process table: asked 5 times a second
POLL_SECONDS = 0.2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(missing_programs()),
        reason=f"Slurm is not installed (missing {', '.join(missing_programs())}; Debian: "
        "apt-get install --no-install-recommends slurmctld slurmd munge slurm-client)",
    ),
    pytest.mark.skipif(
        os.geteuid() != 0, reason="the one-machine Slurm runs its daemons as root (SlurmUser)"
    ),
]

MODULE = """
import os, time
from pathlib import Path

def job():
    return os.environ.get("SLURM_JOB_ID", "")

def hold(folder):
    # Say which job runs this, then wait until the test lets go.
    Path(folder, "started").write_text(job())
    while not Path(folder, "release").exists():
        time.sleep(0.05)
    return job()
"""


def call(name: str, *args: str) -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source=MODULE)
    fn = program.get_function(module=module, name=name)
    program.return_(key="out", value=program.run(fn=fn, args=list(args)))
    return program


def info(router: RouterProcess) -> dict[str, Any]:
    return asyncio.run(http_request(router.port, "GET", "/v1/info")).json()


def capacity(router: RouterProcess) -> int:
    health = asyncio.run(http_request(router.port, "GET", "/health")).json()
    return int(health["load"]["request_capacity"])


def label_count(router: RouterProcess, key: str, value: str) -> int:
    labels = info(router).get("fleet", {}).get("labels", [])
    return sum(e["nodes"] for e in labels if e["key"] == key and e["value"] == value)


def private(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o600)


def node_id_of(job: str) -> str:
    return f"slurm-{job}-{socket.gethostname().split('.')[0]}"


def logged(router: RouterProcess, event: str, job: str) -> bool:
    """Whether the router logged ``event`` for the node of ``job``."""
    node = f"node={node_id_of(job)}"
    return any(event in line and node in line.split() for line in router.log().splitlines())


def leftovers(router: RouterProcess, cluster: SlurmCluster) -> list[str]:
    """Processes still running that belong to this test's nodes or Slurm."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            line = " ".join(process.info["cmdline"] or [])
            environ = process.environ() if process.pid != os.getpid() else {}
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if router.url in line or environ.get("SLURM_CONF") == str(cluster.conf):
            found.append(f"{process.pid}: {line}")
    return found


def hold_a_program(router: RouterProcess, held: Path) -> tuple[threading.Thread, dict[str, Any]]:
    """Runs ``hold`` through the router in a thread until ``held/release`` exists: the
    thread, and the dict that gets its ``result``."""
    held.mkdir()
    outcome: dict[str, Any] = {}

    def run_held() -> None:
        with kcoral.Client(router.url) as client:
            outcome["result"] = client.execute(call("hold", str(held)))

    runner = threading.Thread(target=run_held)
    runner.start()
    return runner, outcome


def test_two_slurm_node_jobs_serve_and_one_drains_while_its_program_runs(tmp_path: Path) -> None:
    router: RouterProcess | None = None
    with slurm_cluster(tmp_path / "slurm") as cluster:
        try:
            # The router's operator gives the Slurm service account a token for slurm-* ids.
            tokens = tmp_path / "node-tokens"
            private(tokens, f"slurm-* {NODE_TOKEN}\n")
            router = start_router(
                tmp_path,
                "--node-token-file",
                str(tokens),
                "--status-check-interval-seconds",
                "0.5",
            )
            # The service account's files (docs/scaling.md "Slurm").
            home = tmp_path / "home"
            config = home / ".config" / "kcoral"
            config.mkdir(parents=True, mode=0o700)
            private(config / "router-url", router.url + "\n")
            private(config / "node-token", NODE_TOKEN + "\n")
            jobs = tmp_path / "jobs"
            jobs.mkdir()
            environment = {k: v for k, v in os.environ.items() if not k.startswith("KCORAL_")}
            environment["HOME"] = str(home)
            environment["PATH"] = f"{Path(sys.executable).parent}:{environment.get('PATH', '')}"
            submit = ["--chdir", str(jobs), "--output", str(jobs / "kcoral-node-%j.out")]
            first = sbatch(cluster, SCRIPT, submit, NODE_OPTIONS, environment)
            second = sbatch(cluster, SCRIPT, submit, NODE_OPTIONS, environment)

            def outputs() -> str:
                return "\n".join(
                    f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
                    for p in sorted(jobs.glob("kcoral-node-*.out"))
                )

            try:
                wait_for(
                    lambda: capacity(router) >= 2, "both nodes are ready", 180, every=POLL_SECONDS
                )
            except AssertionError as exc:
                raise AssertionError(
                    f"{exc}\n{outputs()}\n{router.log()}\n{cluster.logs()}"
                ) from None
            assert label_count(router, "partition", PARTITION) == 2
            log = router.log()  # the node ids come from the job and the host
            for job in (first, second):
                assert cluster.job_state(job) == "RUNNING"
                assert logged(router, "node_connected", job), log

            with kcoral.Client(router.url) as client:
                served = {client.execute(call("job"))["out"] for _ in range(8)}
            assert served <= {first, second} and served, served

            # A program runs on one node; that node is drained under it.
            held = tmp_path / "held"
            runner, outcome = hold_a_program(router, held)
            drained = wait_for(
                lambda: (held / "started").exists() and (held / "started").read_text(),
                "the program started",
                WAIT_SECONDS,
                every=POLL_SECONDS,
            )
            other = second if drained == first else first
            cluster.run("scancel", "--batch", "--signal=TERM", drained)
            wait_for(
                lambda: capacity(router) == 1,
                "the drained node takes no more work",
                WAIT_SECONDS,
                every=POLL_SECONDS,
            )
            with kcoral.Client(router.url) as client:
                while_draining = {client.execute(call("job"))["out"] for _ in range(4)}
            assert while_draining == {other}
            assert runner.is_alive(), "the held program ended before it was let go"
            assert cluster.job_state(drained) == "RUNNING"  # it waits for its program
            (held / "release").write_text("")
            runner.join(120)
            result = outcome["result"]
            assert result.status == "COMPLETED" and result["out"] == drained
            wait_for(
                lambda: cluster.job_state(drained) == "COMPLETED",
                "the drained job ends",
                WAIT_SECONDS,
                every=POLL_SECONDS,
            )
            assert cluster.job_field(drained, "ExitCode") == "0:0"
            wait_for(
                lambda: logged(router, "node_disconnected", drained),
                "the node leaves",
                WAIT_SECONDS,
                every=POLL_SECONDS,
            )
            output = (jobs / f"kcoral-node-{drained}.out").read_text()
            assert "supervisor_stopping" in output and "supervisor_stopped" in output

            # The other node keeps serving.
            with kcoral.Client(router.url) as client:
                after = {client.execute(call("job"))["out"] for _ in range(4)}
            assert after == {other}
            assert cluster.job_state(other) == "RUNNING"

            cluster.run("scancel", "--batch", "--signal=TERM", other)
            wait_for(
                lambda: cluster.job_state(other) == "COMPLETED",
                "the other job ends",
                WAIT_SECONDS,
                every=POLL_SECONDS,
            )
            assert cluster.job_field(other, "ExitCode") == "0:0"
            wait_for(
                lambda: capacity(router) == 0, "no node serves", WAIT_SECONDS, every=POLL_SECONDS
            )
            assert "node_token_refused" not in router.log()
        finally:
            if router is not None:
                router.stop()
    assert router is not None
    wait_for(
        lambda: not leftovers(router, cluster), "every process is gone", 60, every=POLL_SECONDS
    )


def service_account(tmp_path: Path, router_url: str) -> tuple[Path, dict[str, str]]:
    """The node files under a fresh HOME, and the environment ``sbatch`` is run in."""
    home = tmp_path / "home"
    config = home / ".config" / "kcoral"
    config.mkdir(parents=True, mode=0o700)
    private(config / "router-url", router_url + "\n")
    private(config / "node-token", NODE_TOKEN + "\n")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KCORAL_")}
    environment["HOME"] = str(home)
    environment["PATH"] = f"{Path(sys.executable).parent}:{environment.get('PATH', '')}"
    return config, environment


def finished(cluster: SlurmCluster, job: str) -> str:
    return wait_for(
        lambda: (state := cluster.job_state(job)) in ("COMPLETED", "FAILED") and state,
        f"job {job} ends",
        WAIT_SECONDS,
        every=POLL_SECONDS,
    )


def test_the_batch_script_maps_the_allocation_onto_kcoral_server_options(
    tmp_path: Path,
) -> None:
    # KCORAL_NODE_DRY_RUN=1: the job prints the command it would exec, one argument a line.
    with slurm_cluster(tmp_path / "slurm") as cluster:
        config, environment = service_account(tmp_path, "http://127.0.0.1:9")
        environment["KCORAL_NODE_DRY_RUN"] = "1"
        jobs = tmp_path / "jobs"
        jobs.mkdir()
        out = ["--chdir", str(jobs), "--output", str(jobs / "dry-%A_%a.out")]
        host = socket.gethostname().split(".")[0]

        gpu_job = sbatch(cluster, SCRIPT, [*out, f"--gres=gpu:{GRES_TYPE}:1"], [], environment)
        array_job = sbatch(
            cluster, SCRIPT, [*out, "--array=1-2"], ["--num-workers", "1"], environment
        )
        assert finished(cluster, gpu_job) == "COMPLETED"
        gpu = (jobs / f"dry-{gpu_job}_4294967294.out").read_text().splitlines()
        assert gpu[:7] == [
            "kcoral",
            "server",
            "--router",
            "http://127.0.0.1:9",
            "--node-id",
            f"slurm-{gpu_job}-{host}",
            "--port",
        ]
        assert pairs(gpu)["--device"] == "gpu" and pairs(gpu)["--gpus"] == "0"
        assert labels(gpu) == {f"gres={GRES_TYPE}", f"partition={PARTITION}"}
        assert NODE_TOKEN not in "\n".join(gpu)
        for task in ("1", "2"):
            assert finished(cluster, f"{array_job}_{task}") == "COMPLETED"
            cpu = (jobs / f"dry-{array_job}_{task}.out").read_text().splitlines()
            assert pairs(cpu)["--node-id"] == f"slurm-{array_job}_{task}-{host}"
            assert pairs(cpu)["--device"] == "cpu" and "--gpus" not in cpu
            assert labels(cpu) == {f"partition={PARTITION}"}
            assert cpu[-2:] == ["--num-workers", "1"]  # the submitter's options come last

        # Submitted as docs/scaling.md says, `(umask 077; sbatch ...)`: Slurm creates the job's
        # output (the server's console) with the submitter's umask, before the script's own
        # `umask 077` runs, so only that keeps it from other users.
        before = os.umask(0o077)
        try:
            private_job = sbatch(cluster, SCRIPT, out, [], environment)
        finally:
            os.umask(before)
        assert finished(cluster, private_job) == "COMPLETED"
        output = jobs / f"dry-{private_job}_4294967294.out"
        assert "--sandbox" in output.read_text().split()
        assert output.stat().st_mode & 0o777 == 0o600

        # A token file others can read: the job refuses to start, saying what to do.
        (config / "node-token").chmod(0o640)
        refused = sbatch(cluster, SCRIPT, out, [], environment)
        assert finished(cluster, refused) == "FAILED"
        assert cluster.job_field(refused, "ExitCode") == "2:0"
        text = (jobs / f"dry-{refused}_4294967294.out").read_text()
        assert "open to group or others" in text and "chmod 600" in text


def pairs(command: list[str]) -> dict[str, str]:
    return dict(pairwise(command))  # each argument -> the next


def labels(command: list[str]) -> set[str]:
    return {value for flag, value in pairwise(command) if flag == "--node-label"}
