"""Router settings, node states, slot selection and the admission queue, without processes."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import grpc
import pytest
from kcoral_server.node.supervisor import child_arguments, healthy_body, probe_target
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.admission.scheduler import Admission, NoNode, RouterBusy
from kcoral_server.router.admission.selection import MORE, program_gpu_count
from kcoral_server.router.identity import is_valid_node_id, parse_router_origin
from kcoral_server.router.nodes.gateway import status_problem
from kcoral_server.router.nodes.registry import (
    MAX_LAST_ERROR_CHARS,
    MAX_OLD_INSTANCES,
    SERVER_STARTING,
    Registry,
)
from kcoral_server.router.nodes.slot import RouterSlot
from kcoral_server.router.routes.job_index import JobIndex
from kcoral_server.router.routes.session_index import SessionIndex
from kcoral_server.router.settings import RouterSettings, SettingsError, parse_router_args

from kcoral.protocol.multipart import encode_multipart


def test_router_defaults_match_the_spec() -> None:
    settings = parse_router_args([], {})
    assert settings == RouterSettings()
    assert (settings.host, settings.port, settings.max_request_bytes) == (
        "127.0.0.1",
        9000,
        268435456,
    )
    assert settings.max_queued_requests == 1024 and settings.queue_wait_timeout_seconds == 1800


@pytest.mark.parametrize(
    "argv",
    [
        ["--host", "localhost"],
        ["--status-check-interval-seconds", "0"],
        ["--max-status-age-seconds", "-1"],
        ["--unhealthy-threshold", "0"],
        ["--recovery-threshold", "0"],
        ["--queue-wait-timeout-seconds", "-1"],
        ["--reconnect-grace-seconds", "-1"],
        ["--node-retention-seconds", "5"],
        ["--max-request-bytes", "0"],
        ["--max-slots-per-node", "0"],  # every slot of every node refused: no node joins
        ["--max-slots-per-node", "-1"],
        ["--node-token", ""],
    ],
)
def test_invalid_router_settings_are_refused(argv: list[str]) -> None:
    with pytest.raises(SettingsError):
        parse_router_args(argv, {})


def test_non_finite_durations_and_abbreviations_exit() -> None:
    with pytest.raises(SystemExit):
        parse_router_args(["--max-status-age-seconds", "inf"], {})
    with pytest.raises(SystemExit):
        parse_router_args(["--max-request", "5"], {})


def test_the_node_token_flag_overrides_the_environment_and_is_never_shown() -> None:
    assert parse_router_args([], {"KCORAL_NODE_TOKEN": "env"}).node_token == "env"
    settings = parse_router_args(["--node-token", "flag"], {"KCORAL_NODE_TOKEN": "env"})
    assert settings.node_token == "flag" and "flag" not in repr(settings)
    with pytest.raises(SettingsError):
        parse_router_args([], {"KCORAL_NODE_TOKEN": ""})


@pytest.mark.parametrize(
    ("environ", "needle"),
    [
        # a malformed token list crashed the router with a traceback once it had started
        ({"KCORAL_AUTH_TOKEN": "a\nb"}, "KCORAL_AUTH_TOKEN: line 1: expected 'NAME TOKEN'"),
        (
            {"KCORAL_METRICS_TOKEN": " m"},
            "KCORAL_METRICS_TOKEN must be printable ASCII without spaces",
        ),
    ],
)
def test_a_bad_token_from_the_environment_is_refused_naming_its_variable(
    environ: dict[str, str], needle: str
) -> None:
    with pytest.raises(SettingsError, match=needle):
        parse_router_args([], {"KCORAL_NODE_TOKEN": "n", **environ})


def test_node_ids_and_router_origins_follow_the_rules() -> None:
    assert is_valid_node_id("a") and is_valid_node_id("gpu-1.rack_2") and is_valid_node_id("x" * 64)
    for bad in ("", "-a", "_a", "a/b", "x" * 65, "é"):
        assert not is_valid_node_id(bad)
    assert parse_router_origin("http://r:9000/") == ("http://r:9000", "r", 9000, False)
    assert parse_router_origin("https://r")[2:] == (443, True)
    for bad in ("ftp://r", "http://r/x", "http://r?q", "http://u@r", "http://r#f", "r:9000"):
        with pytest.raises(ValueError):
            parse_router_origin(bad)


def status(node: str = "n", healthy: bool = True, **fields: Any) -> pb.SupervisorStatus:
    values = dict(
        node_id=node,
        server_healthy=healthy,
        supervisor_instance_id="sup",
        server_instance_id="inst" if healthy else "",
        worker_count=2 if healthy else 0,
        health_age_millis=5,
    )
    values.update(fields)
    versions = values.pop("versions", {"torch": "1"})
    message = pb.SupervisorStatus(**values)
    message.versions.update(versions)
    return message


def test_status_validation_rejects_what_the_spec_rejects() -> None:
    settings = RouterSettings()
    assert status_problem(status(), settings, None) is None
    assert status_problem(status(healthy=False), settings, None) is None
    assert status_problem(status(node="-x"), settings, None)
    assert status_problem(status(), settings, "other")
    assert status_problem(status(supervisor_instance_id=""), settings, None)
    assert status_problem(status(server_instance_id=""), settings, None)
    assert status_problem(status(worker_count=0), settings, None)
    assert status_problem(status(busy_workers=3), settings, None)
    assert status_problem(status(health_age_millis=5001), settings, None)


class FakeContext:
    async def write(self, frame: Any) -> None:
        pass


def make_registry(**overrides: Any) -> Registry:
    return Registry(RouterSettings(**overrides))


def add_node(registry: Registry, node: str, slots: int = 1, **fields: Any) -> list[RouterSlot]:
    stream = registry.attach_supervisor(node)
    registry.apply_status(stream, status(node, **fields))
    out = []
    for _ in range(slots):
        slot = RouterSlot(node, str(uuid.uuid4()), "inst", FakeContext())
        assert registry.add_slot(slot) is None
        out.append(slot)
    return out


def test_node_states_follow_the_thresholds() -> None:
    registry = make_registry(unhealthy_threshold=2, recovery_threshold=2)
    stream = registry.attach_supervisor("n")
    node = registry.nodes["n"]
    assert node.state == "starting"
    registry.apply_status(stream, status())
    assert node.state == "ready"
    registry.apply_status(stream, status(healthy=False, last_error="boom"))
    assert node.state == "ready" and node.last_error == "boom"
    node.healthy_at -= 3600  # failing past --max-status-age-seconds (below: within it)
    registry.apply_status(stream, status(healthy=False))
    assert node.state == "unhealthy"
    registry.apply_status(stream, status())
    assert node.state == "recovering"
    registry.apply_status(stream, status(healthy=False))
    assert node.state == "unhealthy"
    registry.apply_status(stream, status())
    registry.apply_status(stream, status())
    assert node.state == "ready"
    registry.detach_supervisor(stream)
    assert node.state == "unhealthy" and not node.connected


def test_a_draining_node_reads_draining_then_left_and_a_restarted_one_is_ready_at_once() -> None:
    registry = make_registry(unhealthy_threshold=1, recovery_threshold=3)
    stream = registry.attach_supervisor("n")
    node = registry.nodes["n"]
    registry.apply_status(stream, status())
    stopping = "KCoral Server is shutting down"
    registry.apply_status(stream, status(healthy=False, draining=True, last_error=stopping))
    assert node.state == "draining" and node.last_error == stopping
    assert not registry.control_nodes(ready_only=True)  # it takes nothing new
    registry.detach_supervisor(stream)
    assert node.state == "left" and not node.connected
    restarted = registry.attach_supervisor("n")
    registry.apply_status(restarted, status(supervisor_instance_id="sup-2"))
    assert node.state == "ready"  # a fresh start, not a recovery from failures


def test_a_node_whose_server_is_starting_reads_starting_not_unhealthy() -> None:
    # Its supervisor says "KCoral Server is starting" before each start (ROUTER §12); a new
    # node, or one back after a drain, went unhealthy -> recovering -> ready at every start,
    # and an operator's alert on unhealthy nodes fired at every undrain (fleet soak).
    registry = make_registry(unhealthy_threshold=1, recovery_threshold=3)
    stream = registry.attach_supervisor("n")
    node = registry.nodes["n"]
    registry.apply_status(stream, status(healthy=False, last_error=SERVER_STARTING))
    registry.apply_status(stream, status(healthy=False, last_error=SERVER_STARTING))
    assert node.state == "starting" and node.last_error == SERVER_STARTING
    registry.apply_status(stream, status())
    assert node.state == "ready"
    registry.apply_status(stream, status(healthy=False, draining=True))
    registry.detach_supervisor(stream)
    assert node.state == "left"
    back = registry.attach_supervisor("n")
    registry.apply_status(back, status(healthy=False, last_error=SERVER_STARTING))
    assert node.state == "starting"
    registry.apply_status(back, status())
    assert node.state == "ready"
    # a ready node whose server restarts (a crash) is failing: the threshold counts it
    node.healthy_at -= 3600
    registry.apply_status(back, status(healthy=False, last_error=SERVER_STARTING))
    assert node.state == "unhealthy"
    # so does a starting node whose server fails otherwise
    other = make_registry()
    failing = other.attach_supervisor("m")
    other.apply_status(failing, status("m", healthy=False, last_error="exited with status 2"))
    assert other.nodes["m"].state == "unhealthy"


def test_failing_statuses_within_the_status_age_leave_a_ready_node_ready() -> None:
    # A supervisor sends its last probe's failure again at each health interval while its
    # next probe waits: one slow answer made three failing statuses, and the node read
    # unhealthy for a server busy a second (ROUTER §6). It takes no new work meanwhile.
    registry = make_registry(unhealthy_threshold=3, max_status_age_seconds=5)
    add_node(registry, "n")
    node = registry.nodes["n"]
    assert node.stream is not None
    for _ in range(6):
        registry.apply_status(node.stream, status(healthy=False, last_error="timed out"))
    assert node.state == "ready" and node.saturated(node.healthy_at)
    assert registry.select(None, "r") is None
    registry.apply_status(node.stream, status())
    assert node.state == "ready" and registry.select(None, "r") is not None
    # still failing past the age: out at the staleness check, without waiting for a status
    for _ in range(3):
        registry.apply_status(node.stream, status(healthy=False, last_error="timed out"))
    node.healthy_at -= 6
    node.last_status_at = node.healthy_at + 6  # its statuses keep coming: not stale
    registry.check()
    assert node.state == "unhealthy" and node.connected


def test_a_long_last_error_is_kept_cut() -> None:
    registry = make_registry()
    stream = registry.attach_supervisor("n")
    registry.apply_status(stream, status(healthy=False, last_error="x" * 300_000))
    assert registry.nodes["n"].last_error == "x" * MAX_LAST_ERROR_CHARS  # ROUTER §4.3


def test_a_starting_node_fails_at_once_and_a_lost_stream_needs_recovery() -> None:
    registry = make_registry(recovery_threshold=2)
    stream = registry.attach_supervisor("n")
    registry.apply_status(stream, status(healthy=False))
    assert registry.nodes["n"].state == "unhealthy"
    assert registry.attach_supervisor("n") is None  # the first stream still reports
    registry.nodes["n"].last_status_at -= 3600  # ...until it falls silent (half-open)
    newer = registry.attach_supervisor("n")
    assert stream.superseded and stream.ended.is_set()  # the gateway ends its call now
    registry.apply_status(newer, status())
    assert registry.nodes["n"].state == "recovering"


def test_the_first_healthy_node_fixes_the_cohort_baseline() -> None:
    registry = make_registry()
    add_node(registry, "a", versions={"torch": "1"})
    add_node(registry, "b", versions={"torch": "2"})
    assert registry.baseline == ({}, {"torch": "1"})
    assert registry.nodes["b"].state == "incompatible"
    registry.apply_status(registry.nodes["b"].stream, status("b", versions={"torch": "1"}))
    assert registry.nodes["b"].state == "ready"


def test_selection_prefers_the_lower_load_and_honours_affinity() -> None:
    registry = make_registry()
    add_node(registry, "a", slots=2)
    add_node(registry, "b", slots=2)
    first = registry.select(None, "r1")
    assert first is not None
    second = registry.select(None, "r2")
    assert second is not None and second[0] is not first[0]  # the other node has less load
    third = registry.select(first[0].node_id, "r3")
    assert third is not None and third[0] is first[0]
    assert registry.select(None, "r4")[0] is second[0]
    assert registry.select(None, "r5") is None  # every slot is busy


def test_a_saturated_node_is_skipped_until_its_next_healthy_status() -> None:
    registry = make_registry(status_check_interval_seconds=60)
    add_node(registry, "a")
    registry.mark_saturated("a")
    assert registry.select(None, "r") is None
    registry.apply_status(registry.nodes["a"].stream, status("a"))
    assert registry.select(None, "r") is not None


def test_a_new_server_instance_closes_the_old_slots() -> None:
    registry = make_registry()
    (old,) = add_node(registry, "a")
    registry.apply_status(registry.nodes["a"].stream, status("a", server_instance_id="new"))
    assert old.closed.is_set()
    stale = RouterSlot("a", "s2", "inst", FakeContext())
    assert registry.add_slot(stale) is not None  # FAILED_PRECONDITION for a replaced instance


def test_a_supervisor_reporting_ever_new_instances_leaves_a_bounded_record() -> None:
    registry = make_registry()
    add_node(registry, "a")
    stream = registry.nodes["a"].stream
    for number in range(MAX_OLD_INSTANCES * 3):
        registry.apply_status(stream, status("a", server_instance_id=f"instance-{number}"))
    node = registry.nodes["a"]
    assert len(node.old_instances) == MAX_OLD_INSTANCES  # the newest replaced ones
    newest_replaced = f"instance-{MAX_OLD_INSTANCES * 3 - 2}"
    assert registry.add_slot(RouterSlot("a", "s-new", newest_replaced, FakeContext()))
    # one forgotten since is kept, like a pending slot, and never receives work
    ancient = RouterSlot("a", "s-old", "instance-0", FakeContext())
    assert registry.add_slot(ancient) is None
    assert ancient not in node.current_slots()


def test_the_admission_queue_is_bounded_fifo_and_timed() -> None:
    async def scenario() -> None:
        registry = make_registry()
        admission = Admission(registry, max_queued=2, wait_timeout=5)
        registry.on_change = admission.wake
        first = asyncio.ensure_future(admission.acquire(None, "1"))
        second = asyncio.ensure_future(admission.acquire(None, "2"))
        await asyncio.sleep(0)
        with pytest.raises(RouterBusy):
            await admission.acquire(None, "3")
        assert admission.waiting == 2
        (slot,) = add_node(registry, "a")
        _node, leased = await first
        assert leased is slot and slot.request_id == "1" and not second.done()
        registry.release(slot)
        assert (await second)[1] is slot
        quick = Admission(make_registry(), max_queued=1, wait_timeout=0.05)
        with pytest.raises(NoNode):
            await quick.acquire(None, "x")

    asyncio.run(scenario())


def test_the_admission_queue_serves_the_identities_waiting_in_turn() -> None:
    # Team soak: one client's burst held every other client's requests behind all of it.
    async def scenario() -> None:
        registry = make_registry()
        admission = Admission(registry, max_queued=10, wait_timeout=5)
        registry.on_change = admission.wake
        waits = {
            request_id: asyncio.ensure_future(admission.acquire(None, request_id, None, who))
            for request_id, who in (
                ("a1", "alice"),
                ("a2", "alice"),
                ("a3", "alice"),
                ("b1", "bob"),
            )
        }
        await asyncio.sleep(0)
        (slot,) = add_node(registry, "a")
        served = []
        for _ in waits:
            for _tick in range(20):  # the handed-over wait's task finishes a few ticks on
                await asyncio.sleep(0)
            (done,) = [r for r, w in waits.items() if w.done() and r not in served]
            served.append(done)
            registry.release((await waits[done])[1])
        assert served == ["a1", "b1", "a2", "a3"]
        assert not slot.busy

    asyncio.run(scenario())


def test_a_request_cancelled_as_a_slot_is_handed_to_it_gives_the_slot_back() -> None:
    # The client goes away in the very tick a freed slot is handed to its queued request.
    # ``asyncio.wait_for`` (Python 3.11) returned that slot and swallowed the cancel: the
    # request was forwarded for nobody and the slot stayed busy with it.
    async def scenario() -> None:
        registry = make_registry()
        admission = Admission(registry, max_queued=4, wait_timeout=5)
        registry.on_change = admission.wake
        queued = asyncio.ensure_future(admission.acquire(None, "gone"))
        await asyncio.sleep(0)
        assert admission.waiting == 1
        (slot,) = add_node(registry, "a")  # wakes the queue: the slot is handed over
        queued.cancel()  # ... and the client leaves in the same tick
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert not slot.busy  # given back
        _node, leased = await asyncio.wait_for(admission.acquire(None, "next"), 1)
        assert leased is slot

    asyncio.run(scenario())


def test_supervisor_helpers_strip_its_options_and_probe_loopback() -> None:
    argv = [
        "--device",
        "cpu",
        "--router",
        "http://r",
        "--node-id=n",
        "--node-token",
        "t",
        "--port",
        "0",
        "--health-interval-seconds",
        "1",
        "--num-workers",
        "2",
    ]
    assert child_arguments(argv) == ["--device", "cpu", "--num-workers", "2"]
    # The child holds no client token: only its tunnel reaches it (ROUTER §12).
    assert child_arguments(["--auth-token-file", "/etc/t", "--device", "cpu"]) == [
        "--device",
        "cpu",
    ]
    assert probe_target("0.0.0.0") == ("127.0.0.1", None)
    assert probe_target("::") == ("::1", None)
    assert probe_target("10.1.2.3") == ("10.1.2.3", ("127.0.0.1", 0))
    good = {
        "status": "ok",
        "instance_id": "i",
        "worker_count": 1,
        "busy_workers": 0,
        "target": {},
        "versions": {"a": "b"},
    }
    assert healthy_body(good) is None
    assert healthy_body({**good, "busy_workers": 2})
    assert healthy_body({**good, "worker_count": 0})
    assert healthy_body({**good, "versions": {"a": 1}})
    assert healthy_body({**good, "status": "starting"})


def test_the_supervisor_gives_up_a_connect_attempt_after_two_seconds() -> None:
    """ROUTER §4.1: a router address that accepts TCP but never answers HTTP/2 costs one
    2 s attempt, then the supervisor's back-off takes over (no hang)."""
    import socket

    from kcoral_server.node.tunnel import CONNECT_TIMEOUT_SECONDS, open_channel, wait_connected

    assert CONNECT_TIMEOUT_SECONDS == 2.0
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never speaks

    async def attempt() -> str:
        channel = open_channel(f"http://127.0.0.1:{silent.getsockname()[1]}")
        try:
            with pytest.raises(ConnectionError) as raised:
                await wait_connected(channel)
            return str(raised.value)
        finally:
            await channel.close()

    try:
        assert asyncio.run(attempt()) == "no connection to the router within 2 s"
    finally:
        silent.close()


def test_a_job_bound_to_a_node_is_never_moved_to_another_that_claims_it() -> None:
    jobs = JobIndex()
    assert jobs.remember("job-1", "good", "alice")
    assert not jobs.remember("job-1", "rogue", "alice")  # a rogue node's list or look-up answer
    assert jobs.node_of("job-1") == "good"
    assert jobs.remember("job-1", "good", "alice")  # its own node may repeat it


def test_a_session_bound_to_a_node_is_never_moved_to_another_that_claims_it() -> None:
    sessions = SessionIndex()
    assert sessions.remember("s-1", "good", "instance-1", "alice")
    assert not sessions.remember("s-1", "rogue", "instance-9", "alice")
    known = sessions.get("s-1")
    assert known is not None and known.node_id == "good"


def test_a_restarted_server_ends_only_the_sessions_of_the_servers_before_it() -> None:
    sessions = SessionIndex()
    sessions.remember("old", "n", "instance-1", "alice")
    sessions.remember("new", "n", "instance-2", "alice")  # made on the new server already
    sessions.remember("elsewhere", "m", "instance-1", "alice")
    sessions.server_restarted("n", "instance-2")
    ended = {
        sid: session.ended for sid in ("old", "new", "elsewhere") if (session := sessions.get(sid))
    }
    assert ended == {
        "old": "session ended: its node n restarted its server; its state is lost",
        "new": None,
        "elsewhere": None,
    }


def test_a_node_that_announced_a_slot_key_takes_only_slots_that_present_it() -> None:
    registry = make_registry()
    early = RouterSlot("n", str(uuid.uuid4()), "inst", FakeContext())  # before any status
    assert registry.add_slot(early) is None
    stream = registry.attach_supervisor("n")
    registry.apply_status(stream, status(slot_key="key-1"))
    assert early.closed.is_set() and early.close_status[0] == grpc.StatusCode.PERMISSION_DENIED
    for stranger in ("", "key-2", "key-"):
        slot = RouterSlot("n", str(uuid.uuid4()), "inst", FakeContext(), slot_key=stranger)
        refused = registry.add_slot(slot)
        assert refused is not None and refused[0] == grpc.StatusCode.PERMISSION_DENIED
    own = RouterSlot("n", str(uuid.uuid4()), "inst", FakeContext(), slot_key="key-1")
    assert registry.add_slot(own) is None
    assert registry.nodes["n"].current_slots() == [own]
    # A restart of the child announces a new key: the old child's slots take no more work.
    registry.apply_status(stream, status(slot_key="key-2"))
    assert own.closed.is_set() and registry.nodes["n"].current_slots() == []


def test_a_supervisor_without_a_slot_key_has_its_slots_taken_on_the_token_alone() -> None:
    registry = make_registry()
    (slot,) = add_node(registry, "published")
    assert registry.nodes["published"].current_slots() == [slot]


def test_a_status_the_client_library_lost_is_asked_again_and_a_real_one_is_not() -> None:
    from router_helpers import LOST_STATUS_DETAILS, STATUS_TRIES, stream_status

    answers = [(grpc.StatusCode.INTERNAL, LOST_STATUS_DETAILS)] * 2
    answers.append((grpc.StatusCode.UNAUTHENTICATED, "invalid or missing node token"))
    asked: list[int] = []

    async def attempt() -> tuple[grpc.StatusCode | None, str]:
        asked.append(1)
        return answers[len(asked) - 1]

    assert asyncio.run(stream_status(attempt)) is grpc.StatusCode.UNAUTHENTICATED
    assert len(asked) == 3

    async def router_says_internal() -> tuple[grpc.StatusCode | None, str]:
        asked.append(1)
        return grpc.StatusCode.INTERNAL, "the router's own failure"

    asked.clear()
    assert asyncio.run(stream_status(router_says_internal)) is grpc.StatusCode.INTERNAL
    assert len(asked) == 1  # the router's INTERNAL is an answer, not a lost one

    async def always_lost() -> tuple[grpc.StatusCode | None, str]:
        asked.append(1)
        return grpc.StatusCode.INTERNAL, LOST_STATUS_DETAILS

    asked.clear()
    assert asyncio.run(stream_status(always_lost)) is grpc.StatusCode.INTERNAL
    assert len(asked) == STATUS_TRIES  # bounded: a persistent loss still fails the test


class HeldContext:
    """A slot stream whose writes wait until ``release`` is set: a frame in flight."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.frames: list[str] = []

    async def write(self, frame: Any) -> None:
        await self.release.wait()
        self.frames.append(frame.WhichOneof("payload"))


def test_a_cancel_while_a_frame_is_in_flight_reaches_the_node_after_it() -> None:
    # The client leaves while the request's head is still being written (a loaded router).
    # The cancel was dropped whenever a write held the slot: the node saw its stream end
    # mid-request instead of ``cancel client_disconnected`` (CI, once in ~20 runs).
    async def scenario() -> None:
        context = HeldContext()
        slot = RouterSlot("n", str(uuid.uuid4()), "inst", context)
        slot.begin("r1")
        head = asyncio.ensure_future(slot.send(pb.SlotFrame(request_id="r1", end=pb.EndOfBody())))
        await asyncio.sleep(0)
        slot.cancel("client_disconnected")
        body = asyncio.ensure_future(slot.send(pb.SlotFrame(request_id="r1", data=b"late")))
        context.release.set()
        await asyncio.wait_for(slot.closed.wait(), 2)
        await head
        with pytest.raises(Exception, match="tunnel_disconnected"):
            await body
        assert context.frames == ["end", "cancel"]  # and nothing of the request after it

    asyncio.run(scenario())


def test_the_router_reads_a_programs_gpu_count_from_the_start_of_its_body() -> None:
    def body(program: bytes, first: str = "program") -> tuple[str, bytes]:
        parts = [(first, "application/json", program), ("blob:" + "0" * 64, "x/y", b"z" * 9)]
        content_type, chunks, _length = encode_multipart(parts)
        return content_type, b"".join(bytes(c) for c in chunks)

    content_type, whole = body(b'{"instructions":[],"options":{"gpu_count":2}}')
    assert program_gpu_count(whole, content_type) == 2
    # a part not whole yet, at any cut, asks for more
    cuts = {program_gpu_count(whole[:cut], content_type) for cut in range(whole.index(b"}}"))}
    assert cuts == {MORE}
    for program in (b'{"options":{}}', b'{"options":{"gpu_count":true}}', b"[", b"{}"):
        assert program_gpu_count(body(program)[1], body(program)[0]) is None
    # another first part, or no multipart at all: unread (the node answers as before)
    content_type, other = body(b'{"options":{"gpu_count":2}}', first="blob:" + "1" * 64)
    assert program_gpu_count(other, content_type) is None
    assert program_gpu_count(whole, "application/json") is None


def test_a_program_waits_for_a_node_with_its_gpus_and_not_for_one_that_left() -> None:
    async def scenario() -> None:
        registry = make_registry()
        admission = Admission(registry, max_queued=4, wait_timeout=5)
        registry.on_change = admission.wake
        (one,) = add_node(registry, "one")
        (two,) = add_node(registry, "two")
        for node, gpus in (("one", 1), ("two", 2)):  # one kind, as their statuses say
            registry.nodes[node].kind, registry.nodes[node].gpus = "h100", gpus
        registry.baselines = {"h100": ({}, {"torch": "1"})}
        for _ in range(3):  # only "two" has two GPUs: never "one"
            _node, held = await admission.acquire(None, "first", None, "", 2)
            assert held is two
            registry.release(held)
        _node, held = await admission.acquire(None, "busy", None, "", 2)
        waiting = asyncio.ensure_future(admission.acquire(None, "next", None, "", 2))
        for _tick in range(5):
            await asyncio.sleep(0)
        assert not waiting.done() and not one.busy  # it waits for "two", not for a 400
        stream = registry.nodes["two"].stream
        assert stream is not None
        registry.detach_supervisor(stream)  # "two" leaves the router
        _node, leased = await waiting
        assert leased is one  # unfiltered again: one's own 400 says how many GPUs it has

    asyncio.run(scenario())
