"""Another token holder floods the server with large finished jobs (a real server).

``--job-retention-bytes`` bounds the finished jobs of every identity together. Before the
fix the oldest finished job went first, whoever owned it: bob, submitting jobs that each
return 200 KiB, made alice's small and older result expire (``404 job_expired``) while he
kept his. Now the owner holding the most bytes gives up its oldest first: bob's flood drops
bob's own results, alice's stays, bob is told which bound took his (the message names
``--job-retention-bytes``), and each dropped job is a ``job_expired`` event in the log.
"""

from __future__ import annotations

import time
from pathlib import Path

from identity_support import TOKEN_A, TOKEN_B, request, token_file

import kcoral

RETURN_BYTES = """
def f(n):
    return b"r" * n
"""


def _program(size: int) -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source=RETURN_BYTES, id="m")
    fn = program.get_function(module=module, name="f", id="fn")
    program.return_(key="r", value=program.run(fn=fn, args=[size], id="r"))
    return program


def test_a_token_holder_flooding_finished_jobs_drops_his_own_results_not_another_s(
    server_factory, tmp_path: Path
) -> None:
    server = server_factory(
        "--auth-token-file",
        str(token_file(tmp_path / "secrets")),
        "--job-retention-bytes",
        "1M",
    )
    with kcoral.Client(server.url, token=TOKEN_A) as alice:
        victim = alice.submit(_program(1000))
        victim.wait()
        with kcoral.Client(server.url, token=TOKEN_B) as bob:
            flood = [bob.submit(_program(200 << 10)) for _ in range(8)]
            for job in flood:
                job.wait()
            time.sleep(1.5)  # one sweep of the retention bound
            assert victim.result()["r"] == b"r" * 1000

            oldest = request(server.url, "GET", f"/v1/jobs/{flood[0].id}", TOKEN_B)
            assert oldest.status == 404
            assert oldest.json["error"]["kind"] == "job_expired"
            assert "--job-retention-bytes" in oldest.json["error"]["message"]
            assert bob.job(flood[-1].id).result()["r"] == b"r" * (200 << 10)

    dropped = [e for e in server.events() if e.get("event") == "job_expired"]
    assert dropped, "each dropped job is an event"
    assert {e["owner"] for e in dropped} == {"bob"}
    assert {e["reason"] for e in dropped} == {"space"}
    assert all(e["retention_bytes"] == 1 << 20 for e in dropped)
