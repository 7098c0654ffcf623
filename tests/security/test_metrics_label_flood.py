"""A token holder cannot grow the number of series a Prometheus scrape holds (EXTENSIONS §13:
labels come from fixed sets, "the number of series is bounded whatever clients send").

The attack, on a real server and through a real router to its real node: rounds of requests
each full of words the attacker made up (job and session ids, unknown paths and methods,
request ids, selectors, content types, wrong tokens, a program's source and its error). A
second round of new words must add no series to the first's, and no word may reach the
text (no label holds a token, id, path or anything of a program)."""

from __future__ import annotations

import secrets
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
from http_helpers import execute, request
from metrics_support import scrape, start_server_with_a_metrics_token
from raw_http import call_program
from router_helpers import router_with_a_node

CLIENT_TOKEN = "client-t0ken-for-the-label-flood"
METRICS_TOKEN = "scraper-t0ken-for-the-label-flood"
NODE_ENV = {"KCORAL_NODE_TOKEN": "n0de-t0ken-for-the-label-flood"}
#: made-up words per round (each sends every request shape below)
WORDS_PER_ROUND = 4
#: how long to wait for the node text that counts a round: a router reads one per node
#: every 5 s (``MIN_RELAY_INTERVAL_SECONDS``); a generous bound, not a measurement
PATIENCE_SECONDS = 60.0


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def flood(url: str, words: list[str]) -> None:
    """Every request shape a token holder controls, once per made-up word."""
    auth = bearer(CLIENT_TOKEN)
    for word in words:
        failing = f"def main():\n    raise ValueError({word!r})\n"
        execute(url, call_program(failing), headers={**auth, "X-Request-ID": word})
        execute(url, call_program(f"def main():\n    return {word!r}\n"), headers=auth)
        for method, path, body, extra in (
            ("GET", f"/v1/jobs/{word}", None, {}),
            ("DELETE", f"/v1/jobs/{word}", None, {}),
            ("GET", f"/v1/sessions/{word}", None, {}),
            ("POST", "/v1/sessions", word.encode(), {"Content-Type": "application/json"}),
            ("GET", f"/{word}", None, {}),
            ("GET", f"/metrics/{word}", None, {}),
            ("PATCH", f"/execute?{word}=1", None, {}),
            ("POST", "/execute", b"x", {"Content-Type": f"multipart/form-data; boundary={word}"}),
            ("POST", "/v1/jobs", b"x", {"Content-Type": f"text/{word}"}),
            ("POST", "/execute", b"x", {"X-KCoral-Select": f"gpu={word}"}),
            ("POST", "/execute", b"x", {"X-KCoral-Select": word}),
        ):
            request(url, method, path, body, {**auth, "X-Request-ID": word, **extra})
        request(url, "POST", "/execute", b"x", bearer(f"wrong-{word}"))
        request(url, "GET", "/v1/jobs", None, bearer(f"wrong-{word}"))


def series(url: str, token: str = METRICS_TOKEN) -> dict[str, float]:
    """``name{labels}`` -> value of every sample of ``url``'s ``/metrics``."""
    return scrape(url, bearer(token))


def made_up_words(count: int) -> list[str]:
    return [f"w{secrets.token_hex(5)}" for _ in range(count)]


def assert_no_series_added(before: dict[str, float], after: dict[str, float]) -> None:
    """No series of ``after`` that ``before`` lacks, the workers' lives left out: a worker's
    retirement (its preloaded spare taking over, say) comes with the pool's own timing, not
    with anything the requests said."""
    added = {key for key in set(after) - set(before) if not key.startswith("kcoral_worker_")}
    assert not added, sorted(added)


def assert_no_word_reaches_the_text(found: dict[str, float], words: list[str]) -> None:
    leaked = [(word, key) for key in found for word in words if word in key]
    assert not leaked, leaked[:5]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("label-flood")
    running = start_server_with_a_metrics_token(directory, CLIENT_TOKEN, METRICS_TOKEN)
    yield running
    running.stop()


def test_a_token_holders_made_up_words_add_no_series_to_a_servers_metrics(server) -> None:
    first, second = made_up_words(WORDS_PER_ROUND), made_up_words(WORDS_PER_ROUND)
    series(server.url)  # a scrape counts itself (endpoint metrics) in the next one
    flood(server.url, first)
    after_first = series(server.url)
    flood(server.url, second)
    after_second = series(server.url)
    assert_no_series_added(after_first, after_second)
    assert_no_word_reaches_the_text(after_second, first + second)
    # the rounds were counted, so they did reach the metrics
    programs = 'kcoral_requests_total{error_kind="runtime",reason="program_failed",status="200"}'
    assert after_second[programs] - after_first[programs] == WORDS_PER_ROUND


def scrape_until(url: str, key: str, value: float) -> dict[str, float]:
    """The router's samples once its sample ``key`` reads ``value``."""
    deadline = time.monotonic() + PATIENCE_SECONDS
    while True:
        found = series(url, CLIENT_TOKEN)  # a client token reads a router's metrics too
        if found.get(key) == value:
            return found
        assert time.monotonic() < deadline, f"the node's text never counted the round: {found}"
        threading.Event().wait(0.2)


def test_a_token_holders_made_up_words_add_no_series_to_a_routers_metrics(
    tmp_path: Path,
) -> None:
    """The router's own series and the node series it relays: the node counts what the
    router forwards to it, and its supervisor sends that text up every 0.3 s."""
    failed = (
        'kcoral_requests_total{error_kind="runtime",kind="cpu",node="n1",'
        'reason="program_failed",status="200"}'
    )
    with router_with_a_node(
        tmp_path,
        f"alice {CLIENT_TOKEN}\n",
        NODE_ENV,
        "--metrics-interval-seconds",
        "0.3",
    ) as router:
        rounds: list[dict[str, float]] = []
        words: list[str] = []
        for round_number in (1, 2):
            round_words = made_up_words(WORDS_PER_ROUND)
            words += round_words
            flood(router.url, round_words)
            rounds.append(scrape_until(router.url, failed, round_number * WORDS_PER_ROUND))
    after_first, after_second = rounds
    assert_no_series_added(after_first, after_second)
    assert_no_word_reaches_the_text(after_second, words)
