"""A job whose node restarted its server is answered as lost, naming the node (ROUTER §13):
through a real router onto a real CPU node, a job holds the node's seat, the node's server
is killed (SIGKILL, as a crash) and its supervisor starts a new one; the job's owner then
asks for it and reads ``job lost: its node cpu-a restarted its server, which held it``
(``404`` ``not_found``, as before), both while it watches the job (its event stream's next
request waits out the restart) and after. Before, the owner read ``job not found`` for the
job it had watched run, which named no cause and read as a wrong id."""

from __future__ import annotations

import signal
from pathlib import Path

import psutil
import pytest
from router_helpers import Node, start_router, stopping
from test_router_fleet_status import HOLD, wait_until_its_seat_is_free

import kcoral
from kcoral.errors import KCoralError

pytestmark = pytest.mark.slow
LOST = "job lost: its node cpu-a restarted its server, which held it"


def test_the_owner_of_a_job_lost_with_its_nodes_server_is_told_the_node_restarted(
    tmp_path: Path,
) -> None:
    # past its restart grace, as a router that has run a while (ROUTER §13)
    router = start_router(
        tmp_path, "--status-check-interval-seconds", "0.3", "--reconnect-grace-seconds", "0"
    )
    node = Node(tmp_path, router, "cpu-a", None)
    with stopping(router, [node]):
        wait_until_its_seat_is_free(router)
        program = kcoral.Program()
        module = program.upload(kind="module", source=HOLD)
        never = str(tmp_path / "never-created")
        held = program.run(fn=program.get_function(module=module, name="main"), args=[never])
        program.return_(key="pid", value=held)
        with kcoral.Client(router.url) as client:
            job = client.submit(program, timeout_seconds=120)
            events = job.events()
            for event in events:  # the job runs: its program has begun
                if event.kind == "phase" and event.data.get("op") == "run":
                    break
            old_server = node.server_pid()
            psutil.Process(old_server).send_signal(signal.SIGKILL)
            # watched: the event stream breaks, and its next request waits out the restart
            # for the new server's 404
            with pytest.raises(KCoralError) as watched:
                for _ in events:
                    pass
            with pytest.raises(KCoralError) as lost:
                job.status()
        assert watched.value.status_code == 404
        assert watched.value.message == LOST
        assert lost.value.status_code == 404
        assert lost.value.message == LOST
