"""Test-only stand-ins for protocol modules other engineers are still writing.

The worker harness installs these into a worker process ONLY when the real
``kcoral.protocol.validate`` / ``kcoral.protocol.values`` cannot be imported. They cover
just what these tests send: valid programs and the value types of PROTOCOL §7.5.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import sys
import types
from typing import Any

from kcoral.protocol.paths import normalize_workspace_path
from kcoral.protocol.schema import (
    GetFunction,
    LiteralArg,
    Options,
    Program,
    Ref,
    Return,
    Run,
    Upload,
)


def _arg(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"$ref"} and isinstance(value["$ref"], str):
        if value["$ref"]:
            return Ref(value["$ref"])
    return LiteralArg(value)


def parse_program(obj: Any) -> Program:
    instructions = []
    for index, raw in enumerate(obj["instructions"]):
        op = raw["op"]
        if op == "upload":
            path = raw.get("path")
            instructions.append(
                Upload(
                    index=index,
                    kind=raw["kind"],
                    id=raw.get("id"),
                    source=raw.get("source"),
                    language=raw.get("language", "python"),
                    blob=raw.get("blob"),
                    dtype=raw.get("dtype"),
                    shape=tuple(raw["shape"]) if "shape" in raw else None,
                    path=normalize_workspace_path(path) if path is not None else None,
                )
            )
        elif op == "get_function":
            instructions.append(
                GetFunction(
                    index=index,
                    id=raw["id"],
                    module=Ref(raw["module"]["$ref"]),
                    name=raw["name"],
                    cpu_only=raw.get("cpu_only", False),
                )
            )
        elif op == "run":
            instructions.append(
                Run(
                    index=index,
                    id=raw["id"],
                    fn=Ref(raw["fn"]["$ref"]),
                    args=tuple(_arg(a) for a in raw.get("args", [])),
                )
            )
        else:
            if "kind" in raw:
                path = raw["path"]
                path = (
                    Ref(path["$ref"]) if isinstance(path, dict) else normalize_workspace_path(path)
                )
                instructions.append(
                    Return(index=index, key=raw["key"], kind=raw["kind"], path=path)
                )
            else:
                instructions.append(
                    Return(
                        index=index, key=raw["key"], kind="value", value=Ref(raw["value"]["$ref"])
                    )
                )
    return Program(instructions=tuple(instructions), options=Options())


class ValueEncodingError(Exception):
    pass


def encode_value(value: Any, first_part_index: int) -> tuple[dict, list[Any]]:
    parts: list[Any] = []
    active: set[int] = set()

    def binary(data: bytes) -> dict:
        parts.append(data)
        return {
            "part": f"return:{first_part_index + len(parts) - 1}",
            "sha256": hashlib.sha256(data).hexdigest(),
        }

    def node(v: Any) -> dict:
        torch = sys.modules.get("torch")
        np = sys.modules.get("numpy")
        if v is None:
            return {"type": "null"}
        if isinstance(v, bool):
            return {"type": "boolean", "value": v}
        if isinstance(v, int):
            return {"type": "integer", "value": v}
        if isinstance(v, float):
            if not math.isfinite(v):
                raise ValueEncodingError("non-finite float")
            return {"type": "number", "value": v}
        if isinstance(v, str):
            return {"type": "string", "value": v}
        if isinstance(v, (bytes, bytearray, memoryview)):
            return {"type": "bytes", **binary(bytes(v))}
        if torch is not None and isinstance(v, torch.Tensor):
            v = v.detach().cpu().contiguous()
            dtype = str(v.dtype).removeprefix("torch.")
            data = v.view(torch.uint8).numpy().tobytes() if v.numel() else b""
            return {"type": "tensor", "dtype": dtype, "shape": list(v.shape), **binary(data)}
        if np is not None and isinstance(v, np.ndarray):
            data = np.ascontiguousarray(v).tobytes()
            return {"type": "tensor", "dtype": v.dtype.name, "shape": list(v.shape), **binary(data)}
        if isinstance(v, (list, tuple, dict)):
            if id(v) in active:
                raise ValueEncodingError("value contains a cycle")
            active.add(id(v))
            try:
                if isinstance(v, dict):
                    if not all(isinstance(k, str) for k in v):
                        raise ValueEncodingError("object keys must be strings")
                    return {"type": "object", "value": {k: node(x) for k, x in v.items()}}
                return {"type": "array", "value": [node(x) for x in v]}
            finally:
                active.discard(id(v))
        raise ValueEncodingError(f"cannot encode a value of type {type(v).__name__}")

    return node(value), parts


def install() -> None:
    for name in ("validate", "values"):
        full = f"kcoral.protocol.{name}"
        if importlib.util.find_spec(full) is None:
            module = types.ModuleType(full)
            if name == "validate":
                module.parse_program = parse_program
            else:
                module.encode_value = encode_value
                module.ValueEncodingError = ValueEncodingError
            sys.modules[full] = module
            setattr(sys.modules["kcoral.protocol"], name, module)
