"""The kustomization as Kubernetes receives it (`kubectl kustomize`, offline): every
rendered resource passes the schema, the generated Secrets reach the workloads under their
hashed names, the images carry registry and tag, the commands parse with the tokens the
Secrets hold, and each overlay's DaemonSet is what tests/deploy/test_kubernetes_manifests.py
checks without kubectl (deploy_files ``overlay_node``)."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from deploy_files import KUBERNETES, container, kustomization, overlay_node, overlays
from kcoral_server.front_door.callers import parse_tokens
from kcoral_server.router.settings import parse_router_args
from kcoral_server.settings.command_line import parse_server_args

NODE_TOKEN = "0123456789abcdef0123456789abcdef"


def render(
    tmp_path: Path, edit: dict | None = None, overlay_edits: dict[str, dict] | None = None
) -> dict[tuple[str, str], dict]:
    """The kustomization rendered from a copy, ``edit`` merged into its top level and each
    of ``overlay_edits`` into the overlay it names."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (its kustomize renders the kustomization)")
    copy = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, copy)
    # The token files a user creates (docs/scaling.md); the node token without a newline.
    (copy / "secrets" / "node-token").write_text(NODE_TOKEN)
    shutil.copy(copy / "secrets" / "client-tokens.example", copy / "secrets" / "client-tokens")
    if edit is not None:
        spec = kustomization() | edit
        (copy / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    for name, overlay_edit in (overlay_edits or {}).items():
        folder = copy / "overlays" / name
        spec = kustomization(KUBERNETES / "overlays" / name) | overlay_edit
        (folder / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    done = subprocess.run(
        [kubectl, "kustomize", str(copy)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    documents = [d for d in yaml.safe_load_all(done.stdout) if d]
    found = {(d["kind"], d["metadata"]["name"]): d for d in documents}
    # Generated Secrets and ConfigMaps are also found by their name without the hash suffix.
    for d in documents:
        if d["kind"] in ("Secret", "ConfigMap"):
            found[d["kind"], d["metadata"]["name"].rsplit("-", 1)[0]] = d
    return found


def test_the_rendered_resources_pass_the_schema_and_live_in_the_namespace(
    tmp_path: Path,
) -> None:
    rendered = render(tmp_path)
    documents = {id(d): d for d in rendered.values()}.values()
    assert {d["kind"] for d in documents} == {
        "Namespace",
        "Deployment",
        "Service",
        "DaemonSet",
        "Secret",
        "ConfigMap",
    }
    for document in documents:
        kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)
        if document["kind"] != "Namespace":
            assert document["metadata"]["namespace"] == "kcoral"


def test_the_rendered_workloads_get_the_tokens_images_and_gpus_set_in_one_place(
    tmp_path: Path,
) -> None:
    edit = {
        "images": [
            {
                "name": "kcoral-router",
                "newName": "registry.example.com/kcoral-router",
                "newTag": "9",
            },
            {"name": "kcoral-node", "newName": "registry.example.com/kcoral-node", "newTag": "9"},
        ]
    }
    # Two GPUs on the H100 machines, set in their overlay.
    h100 = kustomization(KUBERNETES / "overlays" / "h100")
    (patch,) = h100["patches"]
    assert patch["patch"].count("value: 8") == 2
    overlay_edit = {
        "configMapGenerator": [{"name": "kcoral-node-settings", "literals": ["gpus=0,1"]}],
        "patches": [{**patch, "patch": patch["patch"].replace("value: 8", "value: 2")}],
    }
    rendered = render(tmp_path, edit, {"h100": overlay_edit})
    router = rendered["Deployment", "kcoral-router"]["spec"]["template"]["spec"]
    node = rendered["DaemonSet", "kcoral-node-h100"]["spec"]["template"]["spec"]
    other = rendered["DaemonSet", "kcoral-node-a100"]["spec"]["template"]["spec"]
    assert other["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    (router_box,), (node_box,) = router["containers"], node["containers"]
    assert router_box["image"] == "registry.example.com/kcoral-router:9"
    assert node_box["image"] == "registry.example.com/kcoral-node:9"
    assert node_box["resources"]["limits"]["nvidia.com/gpu"] == 2

    def secret_value(name: str, key: str) -> str:
        secret = rendered["Secret", name]
        return base64.b64decode(secret["data"][key]).decode()

    def env_of(box: dict) -> dict[str, str]:
        values = {}
        for env in box["env"]:
            ref = env.get("valueFrom", {})
            if "secretKeyRef" in ref:
                values[env["name"]] = secret_value(ref["secretKeyRef"]["name"], "token")
            elif "configMapKeyRef" in ref:
                config = rendered["ConfigMap", ref["configMapKeyRef"]["name"]]
                values[env["name"]] = config["data"][ref["configMapKeyRef"]["key"]]
        return values

    router_env, node_env = env_of(router_box), env_of(node_box)
    assert router_env["KCORAL_NODE_TOKEN"] == node_env["KCORAL_NODE_TOKEN"] == NODE_TOKEN
    # The client tokens reach the router as the file its command names.
    (volume,) = router["volumes"]
    tokens = secret_value(volume["secret"]["secretName"], "tokens")
    assert len(parse_tokens(tokens)) == 3
    token_file = tmp_path / "tokens"
    token_file.write_text(tokens)
    command = router_box["command"]
    at = command.index("--auth-token-file") + 1
    settings = parse_router_args([*command[2:at], str(token_file), *command[at + 1 :]], router_env)
    assert settings.node_token == NODE_TOKEN
    node_command = [a.replace("$(NODE_NAME)", "gpu-host-7") for a in node_box["command"]]
    server = parse_server_args(node_command[2:], node_env)
    assert list(server.config.gpus) == [0, 1]


def test_each_overlay_renders_as_the_offline_checks_see_it_with_the_shared_parts_added(
    tmp_path: Path,
) -> None:
    rendered = render(tmp_path)
    daemonsets = {name: d for (kind, name), d in rendered.items() if kind == "DaemonSet"}
    assert set(daemonsets) == {f"kcoral-node-{name}" for name in overlays()}
    for name in overlays():
        got = daemonsets[f"kcoral-node-{name}"]
        assert got["metadata"].pop("namespace") == "kcoral"
        box = container(got)
        assert box["image"] == "kcoral-node:0.1.0"
        box["image"] = "kcoral-node"
        # Generated names carry a hash, the overlay's ConfigMap also its kind: the offline
        # form names what the overlay and the base wrote.
        for env in box["env"]:
            source = env.get("valueFrom", {})
            if "secretKeyRef" in source:
                secret = source["secretKeyRef"]
                assert ("Secret", secret["name"]) in rendered
                secret["name"] = secret["name"].rsplit("-", 1)[0]
            elif "configMapKeyRef" in source:
                settings = source["configMapKeyRef"]
                (literal,) = overlays()[name]["configMapGenerator"][0]["literals"]
                key, value = literal.split("=", 1)
                assert rendered["ConfigMap", settings["name"]]["data"] == {key: value}
                unhashed = settings["name"].rsplit("-", 1)[0]
                assert unhashed == f"kcoral-node-settings-{name}"
                settings["name"] = unhashed.removesuffix(f"-{name}")
        assert got == overlay_node(name), name
