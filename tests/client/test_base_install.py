"""A plain ``pip install kcoral`` is a whole client: AsyncClient, pickle and jobs included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def base_dependencies() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {
        requirement.split(">")[0].split("=")[0].split("<")[0].strip()
        for requirement in project["dependencies"]
    }


def test_the_base_install_names_one_http_stack_and_cloudpickle() -> None:
    assert base_dependencies() == {"numpy", "ml_dtypes", "urllib3", "cloudpickle"}


def test_async_client_pickle_functions_and_jobs_work_without_the_server_extra() -> None:
    # Tornado, psutil and the server package made unimportable: what the [server] extra adds.
    code = """
import asyncio, sys
for blocked in ("tornado", "psutil", "kcoral_server", "kcoral_jupyter"):
    sys.modules[blocked] = None
import json
import kcoral
from kcoral.connection.transport import MockTransport, Response
from kcoral.protocol.pickle_envelope import dump_envelope
from kcoral.protocol.multipart import encode_multipart
import hashlib

def handler(request):
    if request.path == "/v1/info":
        body = {"kcoral": kcoral.__version__, "protocol": 1, "features": ["jobs"]}
        return Response(200, {"Content-Type": "application/json"}, json.dumps(body).encode())
    if request.path == "/v1/jobs":
        body = {"job_id": "j1", "request_id": "r1"}
        return Response(202, {"Content-Type": "application/json"}, json.dumps(body).encode())
    output = dump_envelope(request.headers["X-KCoral-Serialization"])
    result = {
        "status": "COMPLETED", "request_id": "r2", "queue_ms": 0, "elapsed_ms": 1,
        "lease_wait_ms": 0, "lease_held_ms": 0, "stdout": "", "stderr": "",
        "stdout_truncated": False, "stderr_truncated": False,
        "results": {"output": {"type": "bytes", "part": "return:0",
                               "sha256": hashlib.sha256(output).hexdigest()}},
    }
    content_type, chunks, _ = encode_multipart([
        ("result", "application/json", json.dumps(result).encode()),
        ("return:0", "application/octet-stream", output),
    ])
    return Response(200, {"Content-Type": content_type}, b"".join(bytes(c) for c in chunks))

async def main():
    client = kcoral.AsyncClient("http://x", transport=MockTransport(handler))
    f = client.function(serialization="pickle")(lambda x: x)
    assert await f.remote(1, run_async=True) == "pickle"
    job = await client.submit(kcoral.Program())
    assert job.id == "j1"

asyncio.run(main())
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
