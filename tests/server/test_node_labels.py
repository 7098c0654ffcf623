"""``kcoral server --router ... --node-label KEY=VALUE`` (ROUTER §6): repeatable, declared
once, and refused with a clear message when a label is malformed, shadows a built-in key,
repeats a key, is one too many, or is given without ``--router``."""

from __future__ import annotations

import pytest
from kcoral_server.settings.command_line import parse_server_args
from kcoral_server.settings.config import (
    MAX_NODE_LABELS,
    InvalidConfigError,
    ServerConfig,
    node_labels,
)

NODE = ["--router", "http://127.0.0.1:9000", "--node-id", "n1"]


def test_labels_are_repeatable_and_become_a_map() -> None:
    settings = parse_server_args([*NODE, "--node-label", "rack=r1", "--node-label=pool=big"], {})
    assert settings.config.node_labels == ["rack=r1", "pool=big"]
    assert node_labels(settings.config) == {"rack": "r1", "pool": "big"}
    assert node_labels(ServerConfig()) == {}


@pytest.mark.parametrize(
    ("label", "message"),
    [
        ("rack", "must be KEY=VALUE"),
        ("gpu=h100", "key 'gpu' is built in"),
        ("arch=sm_90a", "key 'arch' is built in"),
        ("gpus=8", "key 'gpus' is built in"),
        ("node=a", "key 'node' is built in"),
        ("Rack=r1", "key 'Rack' must be 1-32 characters"),
        ("=r1", "key '' must be 1-32 characters"),
        ("k" * 33 + "=v", "must be 1-32 characters"),
        ("rack=", "value of 'rack' must be 1-64 characters"),
        ("rack=" + "v" * 65, "value of 'rack' must be 1-64 characters"),
        ("rack=a b", "value of 'rack' must be"),
        ("rack=a,b", "value of 'rack' must be"),
    ],
)
def test_a_bad_label_is_refused_naming_the_flag_and_why(
    label: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_server_args([*NODE, "--node-label", label], {})
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--node-label" in err and message in err


def test_a_repeated_key_too_many_labels_and_labels_without_a_router_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cases = [
        ([*NODE, "--node-label", "rack=a", "--node-label", "rack=b"], "key 'rack' twice"),
        (
            [*NODE, *(f"--node-label=k{i}=v" for i in range(MAX_NODE_LABELS + 1))],
            f"at most {MAX_NODE_LABELS} labels",
        ),
        (["--node-label", "rack=a"], "--node-label requires --router"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit):
            parse_server_args(argv, {})
        assert message in capsys.readouterr().err
    many = [*NODE, *(f"--node-label=k{i}=v" for i in range(MAX_NODE_LABELS))]
    assert len(parse_server_args(many, {}).config.node_labels) == MAX_NODE_LABELS


def test_the_python_config_checks_labels_the_same_way() -> None:
    with pytest.raises(InvalidConfigError, match="built in"):
        ServerConfig(router_endpoint="http://r:1", node_id="n", node_labels=["gpu=x"])
    config = ServerConfig(router_endpoint="http://r:1", node_id="n", node_labels=("a=b",))
    assert config.node_labels == ["a=b"]
