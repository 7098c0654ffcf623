"""A torch tensor upload is the program's own writable copy of its blob (EXTENSIONS §2),
made in huge-page-backed NumPy memory (``worker/runtime.private_copy``)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from worker_harness import blob, call, function, give, module, ref

pytestmark = pytest.mark.slow  # importing torch takes seconds

ZERO_FIRST = "def zero_first(t):\n    t.view(-1)[0] = 0\n    return t\n"


def tensor_upload(ident: str, sha: str, dtype: str, shape: list[int]) -> dict:
    return {"op": "upload", "kind": "tensor", "id": ident, "blob": sha, "dtype": dtype,
            "shape": shape}  # fmt: skip


def test_writing_into_one_tensor_upload_leaves_another_of_the_same_blob_unchanged(
    shared_worker,
):
    values = np.arange(1, (4 << 20) // 4 + 1, dtype=np.float32)  # 4 MiB: a huge-page copy
    sha, data = blob(values.tobytes())
    shape = [1024, len(values) // 1024]
    result = shared_worker.run(
        [
            tensor_upload("x", sha, "float32", shape),
            tensor_upload("y", sha, "float32", shape),
            module("m", ZERO_FIRST),
            function("zero_first", "m", "zero_first"),
            call("z", "zero_first", ref("x")),
            give("z", "z"),
            give("y", "y"),
        ],
        [(sha, data)],
    )
    assert result.finished.status == "COMPLETED", result.error
    changed = values.copy()
    changed[0] = 0
    assert result.returns["z"][1] == [changed.tobytes()]
    assert result.value("z")["sha256"] == hashlib.sha256(changed.tobytes()).hexdigest()
    assert result.returns["y"][1] == [data]  # the blob itself is untouched
