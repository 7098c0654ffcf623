"""The commands of docs/scaling.md "Deploy it" never put a client token on a command line,
where every user of the machine reads it in ``ps`` (``/proc/PID/cmdline``). Before, step 6
ran ``curl -H "Authorization: Bearer $KCORAL_TOKEN" ...``: the token sat in curl's
arguments for as long as it ran. The line now pipes the header to ``curl -H @-``; run as
written, against a real router, through a ``curl`` that records its arguments."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from deploy_files import ROOT
from test_deploy_docs import commands

sys.path.insert(0, str(ROOT / "tests" / "router"))
from router_helpers import start_router

ALICE = "alice-token-of-the-run-through-0123456789"


def test_the_docs_curl_of_v1_info_sends_the_token_the_router_accepts_and_no_argument_holds_it(
    tmp_path: Path,
) -> None:
    (line,) = [c for c in commands() if "curl" in c and "/v1/info" in c]
    real_curl = shutil.which("curl")
    assert real_curl, "curl is missing (Debian's curl package)"
    # A curl that writes down its arguments, then is the real one.
    shim = tmp_path / "bin"
    shim.mkdir()
    arguments = tmp_path / "curl-arguments"
    (shim / "curl").write_text(
        f'#!/bin/bash\nprintf "%s\\n" "$@" >> {arguments}\nexec {real_curl} "$@"\n'
    )
    (shim / "curl").chmod(0o755)
    tokens = tmp_path / "clients"
    tokens.write_text(f"alice {ALICE}\n")
    tokens.chmod(0o600)
    router = start_router(
        tmp_path, "--auth-token-file", str(tokens), env={"KCORAL_NODE_TOKEN": "n0de-token"}
    )
    try:
        env = {
            "PATH": f"{shim}:{os.environ['PATH']}",
            "KCORAL_URL": router.url,
            "KCORAL_TOKEN": ALICE,
        }
        done = subprocess.run(
            ["bash", "-e", "-c", line], env=env, capture_output=True, text=True, timeout=60
        )
    finally:
        router.stop()
    assert done.returncode == 0, done.stderr
    # The router took the token: no node is ready here, so 503 no_node, not 401.
    assert '"kind": "no_node"' in done.stdout.replace('":"', '": "'), done.stdout
    assert arguments.read_text().strip(), "the line ran no curl"
    assert ALICE not in arguments.read_text()
