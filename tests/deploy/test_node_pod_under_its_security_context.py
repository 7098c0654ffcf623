"""The CPU overlay's node pod, as its manifest says, under what its ``securityContext`` makes
of a container, with no cluster: bubblewrap (as root, outside) builds the container's
filesystem (read-only root, the pod's ``emptyDir`` volumes writable, an unmasked ``/proc``)
and ``setpriv`` drops to the pod's user with no capability and ``no_new_privs``
(``allowPrivilegeEscalation: false``). Its command then starts a node that sandboxes every
worker with bubblewrap, serves a program through a real router, answers its probes and
drains on SIGTERM.

Not made here: the runtime's seccomp and AppArmor profiles (the pod asks for
``Unconfined``), the pod's user namespace (``hostUsers: false``) and its network namespace
(the pod's loopback port is this machine's, so a free one replaces it)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
from deploy_files import container, overlay_node, shown_again
from slurm_cluster import stop_tree
from test_systemd_units import kcoral_entry_point

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from router_helpers import RouterProcess, ready_nodes, start_router

import kcoral

NODE_TOKEN = "node-token-of-the-pod-test"
#: the image's user's home and working folder (deploy/images/node.Dockerfile)
IMAGE_HOME = "/var/lib/kcoral"
#: a hang guard, not a timing check
STOP_SECONDS = 60

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("bwrap") or not shutil.which("setpriv"),
    reason="needs root, bubblewrap and setpriv to build the pod's container",
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def pod_mounts(pod: dict[str, Any], node: dict[str, Any], volumes_at: Path) -> list[str]:
    """bubblewrap's arguments for the container's filesystem: ``volumes_at/<name>`` is each
    ``emptyDir`` on disk, owned by the pod's user as ``fsGroup`` makes it."""
    context = node["securityContext"]
    assert context["readOnlyRootFilesystem"] is True and context["procMount"] == "Unmasked"
    mounts = ["--ro-bind", "/", "/", "--dev", "/dev", "--bind", "/proc", "/proc"]
    # The image has no readable /root; this test's Python may live there (pyenv).
    mounts += ["--tmpfs", "/root"]
    if sys.base_prefix.startswith("/root/"):
        top = str(Path("/root", Path(sys.base_prefix).relative_to("/root").parts[0]))
        mounts += ["--ro-bind", top, top]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    for mount in node["volumeMounts"]:
        target = Path(mount["mountPath"])
        if not target.parent.exists() or not target.exists():
            mounts += ["--tmpfs", str(target.parent)]  # the image has the folder
        empty_dir = volumes[mount["name"]]["emptyDir"]
        if empty_dir.get("medium") == "Memory":
            mounts += ["--tmpfs", str(target)]
            continue
        folder = volumes_at / mount["name"]
        folder.mkdir(parents=True)
        os.chown(folder, pod["securityContext"]["runAsUser"], pod["securityContext"]["fsGroup"])
        mounts += ["--bind", str(folder), str(target)]
    return mounts + shown_again(Path(mount["mountPath"]) for mount in node["volumeMounts"])


def pod_user(pod: dict[str, Any], node: dict[str, Any]) -> list[str]:
    """``setpriv`` to the pod's user, its capabilities dropped and no privilege to gain."""
    context, security = node["securityContext"], pod["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["allowPrivilegeEscalation"] is False
    return [
        "setpriv",
        f"--reuid={security['runAsUser']}",
        f"--regid={security['runAsGroup']}",
        f"--groups={security['fsGroup']}",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
    ]


def pod_environment(node: dict[str, Any]) -> dict[str, str]:
    found = {"HOME": IMAGE_HOME, "PATH": os.environ["PATH"]}
    for entry in node["env"]:
        source = entry["valueFrom"]
        if "fieldRef" in source:
            assert source["fieldRef"] == {"fieldPath": "spec.nodeName"}
            found[entry["name"]] = "cpu-a"
        else:
            assert source["secretKeyRef"]["name"] == "kcoral-node-token"
            found[entry["name"]] = NODE_TOKEN
    return found


@contextmanager
def node_pod(
    tmp_path: Path, router: RouterProcess
) -> Iterator[tuple[subprocess.Popen[bytes], psutil.Process, list[str]]]:
    """The CPU overlay's node container, started, ready: the container (bubblewrap, which
    exits as its command does), its ``kcoral`` process and its startup probe."""
    daemonset = overlay_node("cpu")
    pod = daemonset["spec"]["template"]["spec"]
    node = container(daemonset)
    port = str(free_port())
    command = [a.replace("http://kcoral-router:9000", router.url) for a in node["command"]]
    assert command[command.index("--port") + 1] == "8000"
    command[command.index("--port") + 1] = port
    probe = [a.replace(":8000/", f":{port}/") for a in node["startupProbe"]["exec"]["command"]]
    assert command[0] == "kcoral"  # the image's, first on its PATH
    command[0] = kcoral_entry_point()
    environment = pod_environment(node)
    command = [a.replace("$(NODE_NAME)", environment["NODE_NAME"]) for a in command]
    inside = f'cd {IMAGE_HOME} && exec "$@"'
    wrapper = subprocess.Popen(
        [
            "bwrap",
            *pod_mounts(pod, node, tmp_path / "volumes"),
            "--die-with-parent",
            "--",
            *pod_user(pod, node),
            "sh",
            "-c",
            inside,
            "node",
            *command,
        ],
        stdout=open(tmp_path / "node.log", "w"),
        stderr=subprocess.STDOUT,
        env=environment,
    )
    try:
        ready_nodes(router, 1)
        found = [
            child
            for child in psutil.Process(wrapper.pid).children(recursive=True)
            if "--router" in child.cmdline()
        ]
        # The supervisor: the one whose parent is not a node process too.
        (server,) = [child for child in found if child.ppid() not in {c.pid for c in found}]
        yield wrapper, server, probe
    finally:
        stop_tree(wrapper)  # killing bubblewrap alone leaves its command running


def test_the_cpu_node_pod_sandboxes_its_workers_under_its_security_context(
    tmp_path: Path,
) -> None:
    router = start_router(tmp_path, env={"KCORAL_NODE_TOKEN": NODE_TOKEN})
    try:
        with node_pod(tmp_path, router) as (pod, server, probe):
            assert server.uids().real == 10001
            assert subprocess.run(probe, timeout=60, check=False).returncode == 0
            program = kcoral.Program()
            module = program.upload(
                kind="module",
                source="import os, tempfile\ndef where():\n"
                "    with tempfile.NamedTemporaryFile() as scratch, open('out.txt', 'w') as out:\n"
                "        scratch.write(out.write('written') * b'.')\n"
                "    return os.getuid(), open('/proc/1/cmdline').read().split('\\0')[0]\n",
            )
            where = program.get_function(module=module, name="where")
            program.return_(key="where", value=program.run(fn=where))
            with kcoral.Client(router.url) as client:
                assert client.info()["sandbox"] == "bubblewrap"
                result = client.execute(program)
            assert result.completed, result.error
            # The program ran as the pod's user, in a PID namespace of bubblewrap's, and
            # wrote its workspace and a temporary file.
            uid, init = result["where"]
            assert uid == 10001 and init.endswith("bwrap"), result["where"]
            # Workspaces and sandboxes are in the pod's /tmp volume (sized for them), not in
            # the next writable folder Python's tempfile finds (the state volume).
            assert any((tmp_path / "volumes" / "tmp").glob("kcoral-*"))
            server.send_signal(signal.SIGTERM)
            assert pod.wait(STOP_SECONDS) == 0  # drained
    finally:
        router.stop()
    log = (tmp_path / "node.log").read_text()
    assert "pool_ready sandbox=bubblewrap" in log and "supervisor_stopped" in log, log
