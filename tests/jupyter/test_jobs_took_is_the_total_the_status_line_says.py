"""``%kcoral jobs``'s ``took`` is the job's total, queue included: the number the cell's
status line says (``total``) and the panel's ``Time``. A job that waited 18.6 s behind
another notebook's and ran 82 ms said ``total 18.6 s`` in its cell and ``18.6 s`` in the
panel, and ``took 82.5 ms`` in ``%kcoral jobs``. A real CPU server with one worker, so
the second job waits in line; an in-process shell."""

from __future__ import annotations

import json

import pytest
from IPython.utils.capture import capture_output
from kcoral_jupyter.display import format_ms
from kcoral_shell import kcoral_shell

import kcoral

pytestmark = pytest.mark.timeout(300)


def test_a_queued_jobs_took_counts_its_wait_in_line(server_factory, monkeypatch) -> None:
    server = server_factory("--num-workers", "1")
    with kcoral_shell(server.url, monkeypatch, ("first", "second")) as ip:
        with capture_output():
            # The first job holds the only worker for a while; the second waits for it.
            ip.run_cell("%%kcoral --noblock -r first\nimport time\ntime.sleep(2)\n")
            ip.run_cell("%%kcoral --noblock -r second\nprint('second')\n")
        second = ip.user_ns["second"]
        second.result(timeout=120)
        with capture_output() as listed:
            ip.run_line_magic("kcoral", "jobs")
    table = listed.outputs[-1].data["text/plain"]
    rows = {line.split()[0]: line for line in table.splitlines()[1:]}
    with kcoral.Client(server.url) as client:
        record = json.loads(bytes(client.request("GET", f"/v1/jobs/{second.id}").data))
    total = format_ms(record["queue_ms"] + record["elapsed_ms"])
    assert format_ms(record["elapsed_ms"]) != total  # it did wait in line (the point here)
    assert rows[second.id].endswith(f"  {total}"), (rows[second.id], record)
