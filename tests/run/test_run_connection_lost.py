"""`kcoral run` whose connection to the server is lost while its job runs (CLIENT_API §11)."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import kcoral


class Forwarder:
    """A TCP forwarder to a server on loopback: a network path that can be cut while the
    server behind it runs on."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # cut
            server = socket.create_connection(("127.0.0.1", self.target_port))
            with self.lock:
                self.sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._copy, args=(source, sink), daemon=True).start()

    @staticmethod
    def _copy(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        """Refuse new connections and end the open ones; the server is not told."""
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone does not)
        self.listener.close()
        with self.lock:
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


@pytest.mark.slow
def test_a_connection_lost_mid_run_names_the_job_that_may_run_on(
    server_url: str, in_tmp: Path
) -> None:
    # The reconnects failed and kcoral run ended 'cannot reach the server at URL:
    # Connection refused', as if nothing had started, while the job ran on with no id to
    # follow or cancel it by.
    forwarder = Forwarder(int(server_url.rsplit(":", 1)[1]))
    url = f"http://127.0.0.1:{forwarder.port}"
    code = "print('ready', flush=True); import time; time.sleep(120)"
    command = [sys.executable, "-m", "kcoral", "run", "python", "--url", url, "--", "-c", code]
    client = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert client.stdout is not None and client.stdout.readline() == "ready\n"
        forwarder.cut()
        assert client.wait(timeout=120) == 1
        err = client.communicate()[1]
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    found = re.fullmatch(
        f"kcoral run: lost the server at {re.escape(url)} while the tool ran: "
        r"connection refused; its job (\S+) may run on, and is cancelled 60 s after its "
        r"last follower went: follow or cancel it with "
        rf"kcoral\.Client\('{re.escape(url)}'\)\.job\('(\S+)'\)\n",
        err,
    )
    assert found is not None, err
    assert found[1] == found[2]
    with kcoral.Client(server_url) as direct:
        job = direct.job(found[1])
        assert job.status()["status"] == "RUNNING"
        job.cancel()  # frees the module's worker
