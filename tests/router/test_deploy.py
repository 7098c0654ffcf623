"""The deployment files agree with the command line: ports, commands, probes, token."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

import pytest
from kcoral_server.front_door.callers import parse_tokens
from kcoral_server.router.settings import SettingsError, parse_router_args
from kcoral_server.settings.command_line import parse_server_args

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read_string((DEPLOY / "systemd" / name).read_text())
    return parser


def with_token_file(command: list[str], directory: Path) -> list[str]:
    """``command`` with its ``--auth-token-file`` replaced by a file of named identities."""
    index = command.index("--auth-token-file") + 1
    tokens = directory / "clients"
    tokens.write_text("alice c-alice\nops c-ops admin\n")
    return [*command[:index], str(tokens), *command[index + 1 :]]


def test_the_systemd_units_run_valid_commands_and_restart(tmp_path: Path) -> None:
    router = unit("kcoral-router.service")
    command = shlex.split(router["Service"]["ExecStart"])
    assert command[1] == "router"
    arguments = with_token_file(command[2:], tmp_path)
    # Off loopback: a node token is required (ROUTER §3), and so are client tokens.
    with pytest.raises(SettingsError, match="node token"):
        parse_router_args(arguments, {})
    at = command.index("--auth-token-file")
    without_clients = command[2:at] + command[at + 2 :]
    with pytest.raises(SettingsError, match="without a client token"):
        parse_router_args(without_clients, {"KCORAL_NODE_TOKEN": "t"})
    settings = parse_router_args(arguments, {"KCORAL_NODE_TOKEN": "t"})
    assert settings.port == 9000 and "ops c-ops admin" in (settings.auth_token or "")
    node = unit("kcoral-node.service")
    command = shlex.split(node["Service"]["ExecStart"].replace("%l", "gpu-host-1"))
    assert command[1] == "server"
    server = parse_server_args(command[2:], {"KCORAL_NODE_TOKEN": "t"})
    assert server.supervisor is not None and server.config.node_id == "gpu-host-1"
    assert server.config.router_endpoint.endswith(f":{settings.port}")
    for parsed in (router, node):
        assert parsed["Service"]["Restart"] == "always"
        assert "KCORAL_NODE_TOKEN" not in parsed["Service"]["ExecStart"]
    assert int(node["Service"]["TimeoutStopSec"]) >= 900  # long drain


def test_the_kubernetes_manifests_match_the_cli(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml")
    router_docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "router.yaml").read_text()))
    deployment = next(d for d in router_docs if d["kind"] == "Deployment")
    service = next(d for d in router_docs if d["kind"] == "Service")
    assert deployment["spec"]["replicas"] == 1
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["kcoral", "router"]
    secrets = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]}
    # The Secrets come from the kustomization's generators (deploy/kubernetes/secrets/, kept
    # out of git; the client tokens' format is in client-tokens.example).
    kustomization = yaml.safe_load((DEPLOY / "kubernetes" / "kustomization.yaml").read_text())
    generated = {g["name"]: g["files"][0].split("=", 1) for g in kustomization["secretGenerator"]}
    client_secret = "kcoral-client-tokens"
    key = generated[client_secret][0]
    # The client tokens (named identities) are a mounted file, the node token an env var.
    volume = deployment["spec"]["template"]["spec"]["volumes"][0]
    assert volume["secret"]["secretName"] == client_secret
    assert secrets["KCORAL_NODE_TOKEN"] != client_secret
    assert secrets["KCORAL_NODE_TOKEN"] in generated
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    command = container["command"]
    assert command[command.index("--auth-token-file") + 1] == f"{mount['mountPath']}/{key}"
    example = (DEPLOY / "kubernetes" / "secrets" / "client-tokens.example").read_text()
    assert parse_tokens(example)  # valid identity lines
    settings = parse_router_args(with_token_file(command[2:], tmp_path), {"KCORAL_NODE_TOKEN": "t"})
    ports = {p["containerPort"] for p in container["ports"]}
    assert ports == {settings.port}
    assert container["readinessProbe"]["tcpSocket"]["port"] == settings.port
    assert container["livenessProbe"]["tcpSocket"]["port"] == settings.port
    assert service["spec"]["ports"][0]["targetPort"] == settings.port
    token = container["env"][0]
    assert token["name"] == "KCORAL_NODE_TOKEN" and "secretKeyRef" in token["valueFrom"]

    node_docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "node.yaml").read_text()))
    daemonset = next(d for d in node_docs if d["kind"] == "DaemonSet")
    node = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert node["resources"]["limits"]["nvidia.com/gpu"] >= 1
    command = [arg.replace("$(NODE_NAME)", "worker-7") for arg in node["command"]]
    assert command[:2] == ["kcoral", "server"]
    server = parse_server_args(command[2:], {})
    assert server.config.router_endpoint == (
        f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    )
    env = {e["name"]: e["valueFrom"] for e in node["env"]}
    assert env["KCORAL_NODE_TOKEN"]["secretKeyRef"]["name"] == secrets["KCORAL_NODE_TOKEN"]
    assert env["NODE_NAME"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "--node-token" not in command
