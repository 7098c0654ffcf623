"""A session's worker starts in its owner's turn at the GPU lease (SERVER §5), on a fake-GPU
server in real worker processes. A start-up of no identity goes before the users' waiting
programs; a session's is its owner's doing, and as the server's own, one token holder
creating and ending sessions in a loop would put a CUDA start-up ahead of every other
user's program each time."""

from __future__ import annotations

import threading

from holding_program import holding
from job_helpers import wait_until_it_waits_for_the_gpu
from raw_http import Response, request
from server_process import client_token_file
from waiting import wait_for, wait_for_file

import kcoral

ALICE, BOB, CAROL = (f"{name}-session-turn-token-0123456789" for name in ("alice", "bob", "carol"))
ONE_SHARED_GPU = ["--device", "fake-gpu", "--fake-gpu-count", "1", "--workers-per-gpu", "2"]


def test_a_session_start_up_waits_its_owners_turn_behind_another_users_program(
    server_factory, tmp_path
) -> None:
    tokens = client_token_file(tmp_path, f"alice {ALICE}\nbob {BOB}\ncarol {CAROL}\n")
    server = server_factory(*ONE_SHARED_GPU, "--auth-token-file", str(tokens))
    go = tmp_path / "go"
    with (
        kcoral.Client(server.url, token=ALICE) as alice,
        kcoral.Client(server.url, token=BOB) as bob,
        kcoral.Client(server.url, token=CAROL) as carol,
    ):
        # alice has held the GPU a moment; carol never has: carol's turn comes first
        earlier = alice.submit(holding(tmp_path / "alice-held", tmp_path / "alice-held"))
        assert earlier.result(timeout=60).results["r"] == 1
        holder = bob.submit(holding(tmp_path / "bob-holds", go))
        wait_for_file(tmp_path / "bob-holds", 60.0)
        created: list[Response] = []
        starting = threading.Thread(
            target=lambda: created.append(
                request(
                    server.url, "POST", "/v1/sessions", b"{}", {"Authorization": f"Bearer {ALICE}"}
                )
            )
        )
        starting.start()
        waiting = carol.submit(holding(tmp_path / "carol-holds", tmp_path / "carol-go"))
        wait_until_it_waits_for_the_gpu(waiting, "carol's")
        go.touch()  # bob lets go: carol's program and alice's session start-up wait
        wait_for_file(tmp_path / "carol-holds", 60.0)
        # carol holds the GPU until told, and alice's session worker has not started
        assert created == [] and starting.is_alive()
        (tmp_path / "carol-go").touch()
        wait_for(lambda: not starting.is_alive(), "alice's session started", 60.0)
        assert created[0].status == 201
        assert holder.result(timeout=60).results["r"] == 1
        assert waiting.result(timeout=60).results["r"] == 1
