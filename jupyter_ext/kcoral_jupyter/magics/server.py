"""``%kcoral connect``, ``url``, ``client``, ``local start|stop|log`` and ``version``: which
server the kernel's cells use, and the embedded one (``local_server.py``)."""

from __future__ import annotations

import argparse
import platform

import kcoral
from kcoral import KCoralError, TransportError
from kcoral.errors import answered_but_line, root_reason
from kcoral_jupyter.cell_errors import ServerRefusedError, ServerUnreachableError, refused
from kcoral_jupyter.kernel_client import KernelClient
from kcoral_jupyter.kernel_state import KernelState, normalize_url
from kcoral_jupyter.local_server import STOP_GRACE_SECONDS
from kcoral_jupyter.notebook_session import LOCAL_SERVER_GONE


class ServerCommands:
    """Choosing the kernel's server, and the embedded server's life."""

    def __init__(self, kernel: KernelState) -> None:
        self.kernel = kernel

    def connect(self, args: argparse.Namespace) -> None:
        kernel = self.kernel
        url = normalize_url(args.url)
        try:
            facts = kernel.facts(url)
        except TransportError as exc:
            # Never fall back silently: the next cell says it is not connected.
            reason = (
                answered_but_line("it", exc.answered_but) if exc.answered_but else root_reason(exc)
            )
            kernel.connect_failed(url, reason)
            raise ServerUnreachableError(
                f"could not connect to {url}: {reason}",
                "the kernel stays unconnected (cells refuse to run) until a %kcoral connect "
                "succeeds; check the URL and that the server runs there",
            ) from exc
        except KCoralError as exc:
            # It answers, but refuses (a wrong or missing token): say what to fix, not
            # "check that the server runs".
            # In its own words, not the client's ("set KCORAL_TOKEN, or pass Client(url,
            # token=...)", which a kernel reads only at the extension's first use).
            answer = refused(exc)
            kernel.connect_failed(url, answer.cause, fix=answer.action)
            short = refused(exc, url)
            raise ServerRefusedError(
                f"could not connect: {short.cause}",
                f"{short.action}; then %kcoral connect again (until then cells refuse to run)",
                status_code=exc.status_code,
                kind=exc.kind,
            ) from exc
        kernel.settings.url = url
        kernel.clear_failed_connect()  # also when the URL was already the setting
        kernel.use(url)  # the JupyterLab status bar follows this kernel's connection
        sandbox = f", sandbox: {facts.sandbox}" if facts.sandbox else ""
        features = ", ".join(facts.features)
        print(f"kcoral: connected to {url} ({facts.label}{sandbox}, features: {features})")
        remote = kernel.sessions.active()
        if remote is not None and remote.url != url:
            print(
                f"kcoral: cells still run in {remote.label} on {remote.url} until "
                "%kcoral session stop"
            )

    def url(self, args: argparse.Namespace) -> str:
        """The URL cells run against (starts the local server if that is the default)."""
        return self.kernel.resolve_url()

    def client(self, args: argparse.Namespace) -> KernelClient:
        """``client = %kcoral client``: a Client that follows this kernel's connection (its
        URL and token are looked up on every request, so a restarted embedded server's new
        token is used; the object never holds or shows the token)."""
        return KernelClient(self.kernel)

    def local_start(self, args: argparse.Namespace) -> None:
        local = self.kernel.local
        if local is not None and local.running:  # a start says where (start_local)
            print(f"kcoral: local server running at {local.url}")
            return
        self.kernel.start_local(asked=True)

    def local_stop(self, args: argparse.Namespace) -> None:
        local = self.kernel.local
        if local is not None and local.running:  # its graceful stop may wait for work
            print(
                f"kcoral: stopping the local server at {local.url}: work still running there "
                f"gets up to {STOP_GRACE_SECONDS} s to finish (interrupt to stop it now)",
                flush=True,
            )
        url = local.url if local is not None else None
        stopped = self.kernel.stop_local()
        if not stopped:
            print("kcoral: no local server")
            return
        # A session there ended with the server: said now, not at the next cell.
        ended = self.kernel.sessions.server_gone(url, LOCAL_SERVER_GONE) if url else None
        with_it = f"; {ended.label} ended with it (its state is gone)" if ended else ""
        print(f"kcoral: local server stopped{with_it}")

    def local_log(self, args: argparse.Namespace) -> None:
        """The end of the embedded server's log: it never goes to the notebook or the
        terminal on its own (issue 29.8), so this is the switch that shows it."""
        lines: int = args.lines
        local = self.kernel.local
        path = local.log_path if local is not None else None
        if local is None or path is None:
            print("kcoral: no local server (the first cell without a configured server starts one)")
            return
        tail = local.log_tail(lines)
        shown = len(tail.splitlines())  # a shorter log shows all it has: say how much
        print(f"kcoral: the last {shown} line{'' if shown == 1 else 's'} of {path}")
        print(tail, end="")

    def version(self, args: argparse.Namespace) -> None:
        """The client's version, and the server's when one is chosen (never starts one)."""
        print(f"kcoral {kcoral.__version__} (client; Python {platform.python_version()})")
        kernel = self.kernel
        if kernel.failed_connect is not None:
            # Not "the first cell starts the embedded one": cells refuse to run until a
            # connect succeeds (no quiet fallback), and this must not say otherwise.
            failed_url, reason = kernel.failed_connect
            print(f"server: not connected (%kcoral connect {failed_url} failed: {reason})")
            return
        url = kernel.settings.url or (kernel.local.url if kernel.local else None)
        if not url:
            print(
                "server: none (the local server stopped; the next cell starts a new one)"
                if kernel.gone_local
                else "server: none yet (the first cell starts the embedded one)"
            )
            return
        url = normalize_url(url)
        try:
            info = kernel.client(url).info()
            print(f"server {url}: kcoral {info.get('kcoral')} (protocol {info.get('protocol')})")
        except TransportError as exc:
            if exc.answered_but:
                print(f"server {url}: {answered_but_line('it', exc.answered_but)}")
            else:
                print(f"server {url}: no answer ({root_reason(exc)})")
        except KCoralError as exc:  # no /v1/info (published protocol), or a refused token
            print(f"server {url}: version unknown ({exc})")
