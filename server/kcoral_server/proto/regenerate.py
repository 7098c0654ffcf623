"""Regenerate ``kcoral_gateway_pb2*.py`` from ``kcoral_gateway.proto`` (needs grpcio-tools),
with ``kcoral_gateway_pb2.pyi``: the messages' types, for the type checker.

The generated modules are committed so that installing KCoral never needs protoc; the test
``tests/router/test_proto_current.py`` regenerates them into a temporary folder and compares.
Run: ``python -m kcoral_server.proto.regenerate``.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = "kcoral_gateway.proto"
# Generated code is not ours to lint or reformat.
HEADER = (
    "# ruff: noqa\n# fmt: off\n"
    "# Generated from kcoral_gateway.proto by kcoral_server.proto.regenerate.\n"
)


def generate(out_dir: Path) -> list[Path]:
    """Write the two generated modules and the stub into ``out_dir``; return their paths."""
    from grpc_tools import protoc

    out_dir.mkdir(parents=True, exist_ok=True)
    code = protoc.main(
        [
            "protoc",
            f"-I{HERE}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(HERE / PROTO),
        ]
    )
    if code != 0:
        raise RuntimeError(f"protoc failed with exit status {code}")
    written = []
    for name in ("kcoral_gateway_pb2.py", "kcoral_gateway_pb2.pyi", "kcoral_gateway_pb2_grpc.py"):
        path = out_dir / name
        text = path.read_text()
        # protoc writes a top-level import; inside our package it must be relative.
        text = text.replace(
            "import kcoral_gateway_pb2 as kcoral__gateway__pb2",
            "from . import kcoral_gateway_pb2 as kcoral__gateway__pb2",
        )
        path.write_text(HEADER + text)
        written.append(path)
    return written


if __name__ == "__main__":
    for path in generate(HERE):
        sys.stdout.write(f"wrote {path}\n")
