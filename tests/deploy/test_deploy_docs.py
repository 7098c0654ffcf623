"""docs/scaling.md "Deploy it" runs on the files as they are: the build commands are the build
files' own, each `sed` edit of a kustomization finds its text and leaves the GPU settings in
agreement, an overlay copied as the docs say is a kind of its own, the names the commands
use are the ones the manifests use, the token files are written closed to others, and the
cgroups the docs name are the ones the node makes."""

from __future__ import annotations

import ast
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import yaml
from deploy_files import (
    KUBERNETES,
    ROOT,
    build_commands,
    container,
    kustomization,
    overlay_node,
    overlays,
    resource,
)
from kcoral_server.front_door.callers import parse_tokens
from kcoral_server.gpu.kind import gpu_key
from kcoral_server.processes.cgroups import FRONT_END_LEAF, TREE_PREFIX

DOCS = ROOT / "docs" / "scaling.md"


def deploy_section() -> str:
    text = DOCS.read_text()
    start = text.index("## Deploy it\n")
    return text[start : text.index("\n## ", start + 1)]


def commands() -> list[str]:
    """Every line of the section's bash blocks."""
    blocks = re.findall(r"```bash\n(.*?)```", deploy_section(), re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_the_docs_build_each_image_with_the_command_its_build_file_names() -> None:
    built = {command for command, _image, _tag in build_commands().values()}
    assert built <= set(commands())


def kustomization_edits() -> list[str]:
    """The commands that edit (or copy) a kustomization, without what follows them."""
    edits = [
        c.split(" && kubectl ")[0]
        for c in commands()
        if c.startswith(("sed -i", "cp -r ")) and "kustomization.yaml" in c
    ]
    assert all(" deploy/kubernetes/" in edit for edit in edits)
    return edits


def copy_of_the_files(tmp_path: Path) -> Path:
    """A copy of deploy/kubernetes in ``tmp_path``, where the commands (run from the
    repository root) find it; the copy's deploy/kubernetes."""
    copy = tmp_path / "deploy" / "kubernetes"
    shutil.copytree(KUBERNETES, copy, symlinks=True)
    return copy


def run_in(tmp_path: Path, command: str) -> None:
    done = subprocess.run(
        ["bash", "-e", "-c", command],
        cwd=tmp_path,
        env={"REGISTRY": "registry.example.com/ml", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, command + "\n" + done.stderr


def kustomization_texts(copy: Path) -> dict[str, str]:
    return {str(p.relative_to(copy)): p.read_text() for p in copy.rglob("kustomization.yaml")}


def test_each_edit_of_a_kustomization_finds_its_text(tmp_path: Path) -> None:
    edits = kustomization_edits()
    # Registry, GPUs per machine, a copied overlay and its listing, release tag.
    assert len(edits) == 5
    for number, edit in enumerate(edits):
        copy = copy_of_the_files(tmp_path / str(number))
        before = kustomization_texts(copy)
        run_in(tmp_path / str(number), edit)
        after = kustomization_texts(copy)
        assert after != before, f"{edit} changed nothing"
        for text in after.values():
            assert isinstance(yaml.safe_load(text), dict), edit


def test_the_edit_of_the_gpus_per_machine_keeps_ids_and_count_in_agreement(
    tmp_path: Path,
) -> None:
    (edit,) = [e for e in kustomization_edits() if "gpus=" in e]
    copy = copy_of_the_files(tmp_path)
    run_in(tmp_path, edit)
    (kind,) = [name for name in overlays(copy) if overlays(copy)[name] != overlays()[name]]
    (settings,) = overlays(copy)[kind]["configMapGenerator"]
    gpus = settings["literals"][0].split("=", 1)[1].split(",")
    resources = container(overlay_node(kind, copy))["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"]
    assert resources["limits"]["nvidia.com/gpu"] == len(gpus) != 8


def test_an_overlay_copied_as_the_docs_say_is_a_kind_of_its_own(tmp_path: Path) -> None:
    copy_commands = [e for e in kustomization_edits() if "h200" in e]
    assert len(copy_commands) == 2
    copy = copy_of_the_files(tmp_path)
    for command in copy_commands:
        run_in(tmp_path, command)
    assert set(overlays(copy)) == set(overlays()) | {"h200"}
    text = (copy / "overlays" / "h200" / "kustomization.yaml").read_text()
    assert "h100" not in text.lower(), text
    daemonset = overlay_node("h200", copy)
    assert daemonset["metadata"]["name"] == "kcoral-node-h200"
    assert daemonset["spec"]["selector"]["matchLabels"]["kcoral/kind"] == "h200"
    product = daemonset["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"]
    (wanted,) = re.findall(r"s/NVIDIA-H100-80GB-HBM3/([^/]+)/", copy_commands[0])
    assert product == wanted and gpu_key(product.replace("-", " ")) == "h200"
    assert f"gpu-product={product}" in container(daemonset)["command"]


def test_the_docs_use_the_names_the_manifests_use() -> None:
    text = " ".join(commands())
    selector = resource("DaemonSet", "kcoral-node")["spec"]["template"]["spec"]["nodeSelector"]
    ((label, _value),) = selector.items()
    assert f"{label}-" in text
    # Each kind's machines are labelled as its overlay's node selector asks.
    for name in overlays():
        value = overlay_node(name)["spec"]["template"]["spec"]["nodeSelector"][label]
        assert f"{label}={value}" in text, name
    assert f"-n {kustomization()['namespace']}" in text
    assert "kubectl apply -k deploy/kubernetes" in text
    for generator in kustomization()["secretGenerator"]:
        path = generator["files"][0].split("=", 1)[1]
        assert f"deploy/kubernetes/{path}" in text
    labels = resource("DaemonSet", "kcoral-node")["spec"]["template"]["metadata"]["labels"]
    assert "-l app.kubernetes.io/name=" + labels["app.kubernetes.io/name"] in text
    assert "-L kcoral/kind" in text and "-L nvidia.com/gpu.product" in text
    assert "svc/kcoral-router 9000:9000" in text and "deploy/kcoral-router" in text


def test_the_docs_python_line_is_valid_python() -> None:
    (line,) = [c for c in commands() if c.startswith("python -c ")]
    (_python, _flag, code) = shlex.split(line)
    ast.parse(code)


def test_the_docs_write_the_token_files_closed_to_group_and_others(tmp_path: Path) -> None:
    # Under the usual umask 022 the admin token was readable by anyone on the machine.
    writes = [c for c in commands() if "> deploy/kubernetes/secrets/" in c]
    assert len(writes) == 2
    copy = copy_of_the_files(tmp_path)
    for command in writes:
        run_in(tmp_path, f"umask 022; {command}")
    node_token = copy / "secrets" / "node-token"
    client_tokens = copy / "secrets" / "client-tokens"
    for path in (node_token, client_tokens):
        assert path.stat().st_mode & 0o077 == 0, path.name
    assert "\n" not in node_token.read_text()
    identities = parse_tokens(client_tokens.read_text())
    assert [i.name for i in identities.values() if i.admin] == ["ops"]


def test_the_docs_name_the_cgroups_the_node_makes_under_its_systemd_unit() -> None:
    # The docs once said the systemd unit enforced no per-worker limit, while the unit
    # delegates its cgroup and the front-end moves into a leaf beside the workers' parent.
    text = DOCS.read_text()
    assert f"`{FRONT_END_LEAF}`" in text and f"`{TREE_PREFIX}<pid>`" in text
    assert "not done yet" not in text
