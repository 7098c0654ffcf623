"""The Kubernetes manifests pass the schema and agree with the code, the images and each
other: commands through the real argument parsers, probes, drain time, tokens (and that the
pod's user can read their Secret files), the sandbox's needs, the kustomization's one place
for images, tokens and replicas, and its overlays: one node DaemonSet per GPU kind, each on
its own machines with its product and GPUs.

No kubectl here: each overlay's JSON patch is applied to the base in Python (deploy_files
``patched``: add, replace, remove, test), which is what the overlay makes of the base's
DaemonSet before the kustomization adds namespace, images and the tokens' hashed names;
tests/deploy/test_kustomize_render.py renders the same with `kubectl kustomize` where it is
installed and compares."""

from __future__ import annotations

import ipaddress
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import kubernetes_validate
import pytest
from deploy_files import (
    IMAGES,
    KUBERNETES,
    build_commands,
    container,
    final_stage_instructions,
    kustomization,
    manifests,
    overlay_node,
    overlay_patch,
    overlays,
    patched,
    project_version,
    resource,
)
from kcoral_server.front_door.callers import parse_tokens
from kcoral_server.gpu.kind import CPU_KIND, gpu_key
from kcoral_server.router.settings import parse_router_args
from kcoral_server.settings.command_line import parse_server_args
from kcoral_server.settings.config import node_labels

# The newest Kubernetes the installed schema knows (kubernetes-validate is pinned in the
# test extra), validated strictly: a misspelt or misplaced field fails.
KUBERNETES_VERSION = kubernetes_validate.latest_version()


def node() -> dict:
    return resource("DaemonSet", "kcoral-node")


def router() -> dict:
    return resource("Deployment", "kcoral-router")


def node_command() -> list[str]:
    """The node container's command with the downward-API node name filled in."""
    command = [arg.replace("$(NODE_NAME)", "gpu-host-7") for arg in container(node())["command"]]
    assert command[:2] == ["kcoral", "server"]
    return command


def router_arguments(tmp_path: Path) -> list[str]:
    command = list(container(router())["command"])
    assert command[:2] == ["kcoral", "router"]
    index = command.index("--auth-token-file") + 1
    tokens = tmp_path / "tokens"
    tokens.write_text((KUBERNETES / "secrets" / "client-tokens.example").read_text())
    command[index] = str(tokens)
    return command[2:]


def test_every_manifest_passes_the_kubernetes_schema_strictly() -> None:
    failures = []
    for name, documents in manifests().items():
        assert documents, f"{name} holds no resource"
        for document in documents:
            try:
                kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as error:
                label = f"{name}: {document['kind']}/{document['metadata']['name']}"
                failures.append(f"{label}: {str(error).splitlines()[0]}")
    assert not failures


def test_every_yaml_file_is_a_resource_of_the_kustomization() -> None:
    listed = set(kustomization()["resources"])
    # node.yaml is a link to the base's DaemonSet (where it was before the overlays), and
    # not a resource of its own: the overlays make one DaemonSet per kind of it.
    link = KUBERNETES / "node.yaml"
    assert link.is_symlink() and link.resolve() == (KUBERNETES / "base" / "node.yaml")
    on_disk = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml", "node.yaml"}
    overlay_folders = {f"overlays/{p.name}" for p in (KUBERNETES / "overlays").iterdir()}
    assert listed == on_disk | overlay_folders
    assert kustomization(KUBERNETES / "base")["resources"] == ["node.yaml"]
    for name, overlay in overlays().items():
        assert overlay["resources"] == ["../../base"], name
    assert set(manifests()) == on_disk | {"base/node.yaml"}


def test_the_manifests_name_the_images_the_build_files_produce() -> None:
    built = {image: tag for _command, image, tag in build_commands().values()}
    assert set(built) == {"kcoral-router", "kcoral-node"}
    named = {container(w)["image"] for w in (router(), node())}
    assert named == set(built)
    # The kustomization points those names at a registry and pins them to this release.
    images = {entry["name"]: entry for entry in kustomization()["images"]}
    assert set(images) == set(built)
    for image, tag in built.items():
        assert images[image]["newTag"] == tag == project_version()


def test_the_kustomization_sets_tokens_replicas_and_gpus_of_resources_that_exist() -> None:
    spec = kustomization()
    assert spec["namespace"] == resource("Namespace", "kcoral")["metadata"]["name"]
    # Replicas: only the router's, and always one (a node's streams must share a router).
    assert spec["replicas"] == [{"name": "kcoral-router", "count": 1}]
    assert router()["spec"]["replicas"] == 1
    # Tokens: the two Secrets the workloads read, generated from files kept out of git.
    generated = {s["name"]: s for s in spec["secretGenerator"]}
    assert set(generated) == {"kcoral-node-token", "kcoral-client-tokens"}
    ignored = (KUBERNETES / "secrets" / ".gitignore").read_text().split()
    for secret in generated.values():
        ((key, path),) = (entry.split("=", 1) for entry in secret["files"])
        assert path.startswith("secrets/") and path.removeprefix("secrets/") in ignored
        assert key in {"token", "tokens"}
    refs = []
    for workload in (router(), node()):
        for env in container(workload)["env"]:
            source = env.get("valueFrom", {})
            if "secretKeyRef" in source:
                refs.append((source["secretKeyRef"]["name"], source["secretKeyRef"]["key"]))
    volume = router()["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"]
    assert set(refs) == {("kcoral-node-token", "token")}
    assert volume == "kcoral-client-tokens"


def test_the_router_command_parses_and_needs_both_kinds_of_token(tmp_path: Path) -> None:
    arguments = router_arguments(tmp_path)
    settings = parse_router_args(arguments, {"KCORAL_NODE_TOKEN": "t"})
    assert not ipaddress.ip_address(settings.host).is_loopback
    assert settings.node_token == "t" and "ops" in (settings.auth_token or "")
    spec = router()["spec"]
    box = container(router())
    assert {p["containerPort"] for p in box["ports"]} == {settings.port}
    for probe in ("readinessProbe", "livenessProbe"):
        # /health is 503 until a node is ready, so the probes ask only for the port.
        assert box[probe] == {**box[probe], "tcpSocket": {"port": settings.port}}
    service = resource("Service", "kcoral-router")
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == settings.port
    # Never two routers at once, not even during an update.
    assert spec["strategy"] == {"type": "Recreate"}
    mount = next(m for m in box["volumeMounts"] if m["name"] == "client-tokens")
    command = box["command"]
    assert command[command.index("--auth-token-file") + 1] == f"{mount['mountPath']}/tokens"


def test_the_node_command_parses_and_reaches_the_router_service(tmp_path: Path) -> None:
    server = parse_server_args(node_command()[2:], {"KCORAL_NODE_TOKEN": "t"})
    assert server.supervisor is not None and server.config.node_id == "gpu-host-7"
    service = resource("Service", "kcoral-router")
    port = service["spec"]["ports"][0]["port"]
    assert server.config.router_endpoint == f"http://{service['metadata']['name']}:{port}"
    assert server.config.sandbox == "bubblewrap"
    env = {e["name"]: e for e in container(node())["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "--node-token" not in node_command() and "--auth-token-file" not in node_command()
    # The GPU list comes from the environment the ConfigMap fills.
    with_gpus = parse_server_args(node_command()[2:], {"KCORAL_SERVER_GPUS": "0,1,2,3"})
    assert with_gpus.gpus_given and list(with_gpus.config.gpus) == [0, 1, 2, 3]


def test_the_node_drains_within_its_grace_period_and_probes_its_own_server() -> None:
    server = parse_server_args(node_command()[2:], {})
    spec = node()["spec"]["template"]["spec"]
    # SIGTERM lets active requests finish, each within --max-timeout-seconds; a minute more
    # covers uploads, worker start and the answer.
    assert spec["terminationGracePeriodSeconds"] >= server.config.max_timeout_seconds + 60
    assert node()["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": 1}
    box = container(node())
    port = node_command()[node_command().index("--port") + 1]
    assert "livenessProbe" not in box  # the supervisor restarts its server itself
    for probe in ("startupProbe", "readinessProbe"):
        interpreter, flag, code = box[probe]["exec"]["command"]
        assert (interpreter, flag) == ("python3", "-c")
        compile(code, probe, "exec")
        assert f"http://127.0.0.1:{port}/health" in code


def test_the_node_pod_gives_bubblewrap_what_it_needs_and_nothing_more() -> None:
    pod = node()["spec"]["template"]["spec"]
    context = container(node())["securityContext"]
    # Namespaces made by an unprivileged process and a fresh /proc in them (SERVER §14).
    assert context["seccompProfile"] == {"type": "Unconfined"}
    assert context["appArmorProfile"] == {"type": "Unconfined"}
    assert context["procMount"] == "Unmasked"
    assert pod["hostUsers"] is False  # Kubernetes allows Unmasked only in a user namespace
    # ... and no privilege on the machine.
    assert "privileged" not in context and context["capabilities"] == {"drop": ["ALL"]}
    assert context["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    # The namespace lets such pods in, and says so at the baseline level.
    labels = resource("Namespace", "kcoral")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


def test_both_pods_run_as_the_user_their_images_create() -> None:
    for workload, build_file in ((router(), "router"), (node(), "node")):
        users = [
            rest
            for word, rest in final_stage_instructions(IMAGES / f"{build_file}.Dockerfile")
            if word == "USER"
        ]
        uid, gid = users[-1].split(":")
        context = workload["spec"]["template"]["spec"]["securityContext"]
        assert (context["runAsUser"], context["runAsGroup"]) == (int(uid), int(gid))
        assert container(workload)["securityContext"]["readOnlyRootFilesystem"] is True


def workloads() -> list[dict]:
    """The router and each overlay's node DaemonSet, as the kustomization makes them."""
    return [router(), *(overlay_node(name) for name in overlays())]


def generated_secret_keys() -> dict[str, list[str]]:
    """The keys of each Secret the kustomization generates, by the Secret's name."""
    return {
        generator["name"]: [entry.split("=", 1)[0] for entry in generator["files"]]
        for generator in kustomization()["secretGenerator"]
    }


def secret_files(workload: dict) -> list[tuple[str, int, int]]:
    """Each file of a Secret volume the container mounts, as the kubelet lays it out: its
    name, owner group and mode. The owner is root; the group is the pod's fsGroup where it
    sets one, else root's; the mode is the item's, else the volume's ``defaultMode`` (0644
    where unset)."""
    pod = workload["spec"]["template"]["spec"]
    group = pod.get("securityContext", {}).get("fsGroup", 0)
    mounted = {m["name"] for m in container(workload).get("volumeMounts", [])}
    files = []
    for volume in pod.get("volumes", []):
        secret = volume.get("secret")
        if secret is None or volume["name"] not in mounted:
            continue
        default = secret.get("defaultMode", 0o644)
        # Without items every key of the Secret is a file of that name.
        keys = generated_secret_keys()[secret["secretName"]]
        items = secret.get("items") or [{"path": key} for key in keys]
        for item in items:
            files.append((f"{volume['name']}/{item['path']}", group, item.get("mode", default)))
    return files


def test_every_secret_volume_is_readable_by_the_user_its_pod_runs_as() -> None:
    # Kubernetes writes Secret files owned by root: a pod that runs as another user reads
    # them through group-read and its fsGroup, or not at all. The router's 0400 token file
    # (no fsGroup) made `kcoral router --auth-token-file` exit 2 and the rollout never end.
    checked = 0
    for workload in workloads():
        context = workload["spec"]["template"]["spec"]["securityContext"]
        user, groups = context["runAsUser"], {context["runAsGroup"]}
        groups |= {context.get("fsGroup", context["runAsGroup"])}
        groups |= set(context.get("supplementalGroups", []))
        assert user != 0
        for name, group, mode in secret_files(workload):
            readable = mode & 0o004 or (mode & 0o040 and group in groups)
            assert readable, f"{workload['metadata']['name']}: {name} mode {mode:04o}"
            # ... and no wider than its group: other users of the machine get nothing.
            assert not mode & 0o007, f"{workload['metadata']['name']}: {name} mode {mode:04o}"
            checked += 1
    assert checked >= 1  # the router's client tokens


def test_the_router_reads_its_token_file_as_kubernetes_writes_it() -> None:
    # The audit's reproduction: the Secret's file root-owned with the manifest's mode and
    # group, and the router's own argument parsing run as the pod's user and groups.
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv (util-linux) to run as the pod's user")
    ((name, group, mode),) = secret_files(router())
    context = router()["spec"]["template"]["spec"]["securityContext"]
    groups = sorted({context.get("fsGroup", context["runAsGroup"])})
    box = container(router())
    mount = next(m for m in box["volumeMounts"] if m["name"] == name.split("/")[0])
    command = list(box["command"])
    with tempfile.TemporaryDirectory() as folder:
        Path(folder).chmod(0o755)  # the pod's user must reach the file
        token_file = Path(folder) / "tokens"
        token_file.write_text((KUBERNETES / "secrets" / "client-tokens.example").read_text())
        os.chown(token_file, 0, group)
        token_file.chmod(mode)
        at = command.index("--auth-token-file") + 1
        assert command[at] == f"{mount['mountPath']}/{name.split('/')[1]}"
        command[at] = str(token_file)
        code = (
            "import sys; from kcoral_server.router.settings import parse_router_args; "
            "parse_router_args(sys.argv[1:], {'KCORAL_NODE_TOKEN': 't'})"
        )
        done = subprocess.run(
            [
                setpriv,
                f"--reuid={context['runAsUser']}",
                f"--regid={context['runAsGroup']}",
                "--groups=" + ",".join(str(g) for g in groups),
                sys.executable,
                "-c",
                code,
                *command[2:],
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=folder,
        )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name", ["client-tokens.example"])
def test_the_example_client_tokens_are_named_identities(name: str) -> None:
    identities = parse_tokens((KUBERNETES / "secrets" / name).read_text())
    assert {i.name for i in identities.values()} == {"alice", "bob", "ops"}
    assert [i.name for i in identities.values() if i.admin] == ["ops"]


# The label NVIDIA GPU feature discovery (GPU Operator) puts on each GPU machine: the product
# name with hyphens for spaces, e.g. NVIDIA-H100-80GB-HBM3.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


def gpu_overlays() -> list[str]:
    return [name for name in overlays() if name != CPU_KIND]


def overlay_command(name: str) -> list[str]:
    """The command of overlay ``name``'s node container, its node name filled in."""
    box = container(overlay_node(name))
    command = [arg.replace("$(NODE_NAME)", "gpu-host-7") for arg in box["command"]]
    assert command[:2] == ["kcoral", "server"]
    return command


def test_the_kustomization_makes_one_node_daemonset_per_kind_each_named_for_it() -> None:
    assert {"h100", "a100", CPU_KIND} <= set(overlays())
    for name in overlays():
        daemonset = overlay_node(name)
        assert daemonset["metadata"]["name"] == f"kcoral-node-{name}"
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSION, strict=True)
        # Pods and selector carry the kind, so no DaemonSet claims another's pods; all keep
        # app.kubernetes.io/name, so one `kubectl logs -l` reaches every node pod.
        selector = daemonset["spec"]["selector"]["matchLabels"]
        assert selector == {"app.kubernetes.io/name": "kcoral-node", "kcoral/kind": name}
        assert selector.items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()


def test_no_machine_matches_the_node_selectors_of_two_overlays() -> None:
    # Two node pods on one machine would claim one node id (the machine's name) and fight
    # over its GPUs; so every two overlays ask one machine label for different values.
    chosen = {n: overlay_node(n)["spec"]["template"]["spec"] for n in overlays()}
    for name, pod in chosen.items():
        assert "affinity" not in pod, f"{name}: only the node selector picks machines"
    for a, b in itertools.combinations(chosen, 2):
        first, second = chosen[a]["nodeSelector"], chosen[b]["nodeSelector"]
        assert any(k in second and second[k] != v for k, v in first.items()), (a, b)


def test_each_gpu_overlay_picks_its_product_and_gives_the_node_that_product_as_a_label() -> None:
    base_selector = node()["spec"]["template"]["spec"]["nodeSelector"]
    for name in gpu_overlays():
        selector = overlay_node(name)["spec"]["template"]["spec"]["nodeSelector"]
        product = selector[GPU_PRODUCT_LABEL]
        assert selector == {**base_selector, GPU_PRODUCT_LABEL: product}
        # The overlay is named for the kind the node reports of that product itself.
        assert gpu_key(product.replace("-", " ")) == name
        server = parse_server_args(overlay_command(name)[2:], {"KCORAL_NODE_TOKEN": "t"})
        assert node_labels(server.config) == {"gpu-product": product}
        assert server.config.device == "gpu"


def test_each_gpu_overlay_sets_the_gpu_ids_and_the_device_plugin_count_together() -> None:
    for name in gpu_overlays():
        (settings,) = overlays()[name]["configMapGenerator"]
        ((key, gpus),) = (entry.split("=", 1) for entry in settings["literals"])
        ids = [int(g) for g in gpus.split(",")]
        assert ids == list(range(len(ids))), name
        box = container(overlay_node(name))
        resources = box["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == len(ids), name
        assert resources["requests"]["nvidia.com/gpu"] == len(ids), name
        env = {e["name"]: e for e in box["env"]}
        reference = env["KCORAL_SERVER_GPUS"]["valueFrom"]["configMapKeyRef"]
        assert reference == {"name": settings["name"], "key": key}
        server = parse_server_args(overlay_command(name)[2:], {"KCORAL_SERVER_GPUS": gpus})
        assert server.gpus_given and list(server.config.gpus) == ids


def test_the_cpu_overlay_runs_a_cpu_node_that_asks_the_machine_for_no_gpu() -> None:
    daemonset = overlay_node(CPU_KIND)
    pod, box = daemonset["spec"]["template"]["spec"], container(daemonset)
    assert pod["nodeSelector"] == {"kcoral/node": "cpu"}
    assert "nvidia.com/gpu" not in str(box["resources"]) and "tolerations" not in pod
    assert "KCORAL_SERVER_GPUS" not in {e["name"] for e in box["env"]}
    server = parse_server_args(overlay_command(CPU_KIND)[2:], {"KCORAL_NODE_TOKEN": "t"})
    assert server.config.device == "cpu" and node_labels(server.config) == {}


def test_no_overlay_changes_what_the_node_pod_may_do_or_where_it_connects() -> None:
    base = node()
    base_pod = base["spec"]["template"]["spec"]
    base_server = parse_server_args(node_command()[2:], {"KCORAL_NODE_TOKEN": "t"})
    for name in overlays():
        daemonset = overlay_node(name)
        pod = daemonset["spec"]["template"]["spec"]
        assert container(daemonset)["securityContext"] == container(base)["securityContext"]
        for field in ("securityContext", "hostUsers", "automountServiceAccountToken", "volumes"):
            assert pod[field] == base_pod[field], (name, field)
        server = parse_server_args(overlay_command(name)[2:], {"KCORAL_NODE_TOKEN": "t"})
        assert server.config.router_endpoint == base_server.config.router_endpoint
        assert server.config.sandbox == base_server.config.sandbox == "bubblewrap"
        assert server.config.node_id == "gpu-host-7"


def test_an_overlay_label_that_shadows_a_built_in_key_stops_the_node(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A copied overlay that labelled its A100 machines gpu=h100 would have them claim a kind
    # they are not; the node refuses to start, naming the built-in key.
    operations = overlay_patch(overlays()["a100"])
    forged = [
        {**op, "value": "gpu=h100"} if str(op.get("value")).startswith("gpu-product=") else op
        for op in operations
    ]
    daemonset = patched(node(), forged)
    command = [a.replace("$(NODE_NAME)", "gpu-host-7") for a in container(daemonset)["command"]]
    assert "gpu=h100" in command
    with pytest.raises(SystemExit) as stopped:
        parse_server_args(command[2:], {"KCORAL_NODE_TOKEN": "t"})
    assert stopped.value.code == 2
    assert "'gpu' is built in" in capsys.readouterr().err


def quantity_bytes(text: str) -> int:
    """A Kubernetes quantity with a binary suffix (``64Gi``) in bytes."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    return int(text[:-2]) * units[text[-2:]]


def test_each_node_pod_bounds_its_disk_volumes_above_what_the_server_may_write() -> None:
    # Unbounded emptyDirs let a long-lived node pod (each restart leaves a run folder of up
    # to 2 GiB of log) fill the machine's disk, and the kubelet evict whatever ran there.
    for name in overlays():
        daemonset = overlay_node(name)
        volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
        for volume in volumes.values():
            if "emptyDir" in volume:
                assert "sizeLimit" in volume["emptyDir"], (name, volume["name"])
        command = overlay_command(name)
        env = {}
        for settings in overlays()[name].get("configMapGenerator", []):
            env["KCORAL_SERVER_GPUS"] = settings["literals"][0].split("=", 1)[1]
        server = parse_server_args(command[2:], env)
        config = server.config
        workers = (
            config.workers_per_gpu * len(config.gpus)
            if config.device == "gpu"
            else config.num_workers
        )
        mounts = {m["mountPath"]: m["name"] for m in container(daemonset)["volumeMounts"]}
        # Every worker's workspace at its limit at once fits in /tmp ...
        tmp = quantity_bytes(volumes[mounts["/tmp"]]["emptyDir"]["sizeLimit"])
        assert tmp >= workers * config.workspace_limit_bytes, name
        # ... and the disk cache with room for the event log in the state volume.
        state = volumes[mounts["/var/lib/kcoral"]]["emptyDir"]["sizeLimit"]
        assert str(config.disk_cache_dir).startswith("/var/lib/kcoral/")
        assert str(config.log_dir).startswith("/var/lib/kcoral/")
        assert quantity_bytes(state) >= 2 * config.disk_cache_capacity_mbytes * (1 << 20), name


def test_no_workload_takes_a_token_from_a_plain_environment_value() -> None:
    # docs/scaling.md "Tokens, secrets and identities": the node token comes from the Secret
    # kcoral-node-token, the client tokens only as the router's mounted token file. A literal
    # `value:` would put a token in the manifest, in git and in `kubectl get -o yaml`.
    for workload in (router(), *(overlay_node(name) for name in overlays())):
        environment = container(workload).get("env", [])
        for entry in environment:
            secret = entry.get("valueFrom", {}).get("secretKeyRef")
            if "TOKEN" in entry["name"] or "SECRET" in entry["name"]:
                assert "value" not in entry and secret is not None, entry
        names = {entry["name"] for entry in environment}
        assert not names & {"KCORAL_AUTH_TOKEN", "KCORAL_TOKEN"}, names  # client tokens
