"""Settings of the IPython extension, as traitlets (``%config KCoral.url = ...``).

Precedence: a value set by ``%config`` or a config file > the environment variables
``KCORAL_URL`` / ``KCORAL_TOKEN`` > defaults. The token is never shown: its trait is
excluded from ``%config KCoral`` listings' values by ``describe``, and ``repr`` hides it.
"""

from __future__ import annotations

import os
from typing import Any

from traitlets import Bool, Float, Int, List, Unicode, default
from traitlets.config import Configurable


class KCoral(Configurable):
    """Where ``%%kcoral`` cells run and with which defaults."""

    url = Unicode(
        "",
        help="KCoral server or router URL. Empty: KCORAL_URL, else start a local server.",
    ).tag(config=True)
    token = Unicode("", help="Bearer token for the server (default: KCORAL_TOKEN).").tag(
        config=True
    )
    timeout = Float(
        None, allow_none=True, help="Default --timeout in seconds (None: the server's default)."
    ).tag(config=True)
    output_limit = Int(
        None, allow_none=True, help="Default --output-limit in bytes per stream."
    ).tag(config=True)
    quiet = Bool(False, help="Hide the status and summary lines.").tag(config=True)
    use_jobs = Bool(True, help="Use the jobs API for live output when the server offers it.").tag(
        config=True
    )
    verbose_errors = Bool(
        False,
        help="Show whole tracebacks (internal frames included) instead of the two-line errors.",
    ).tag(config=True)
    require_gpu = Bool(
        False, help="Refuse to run cells on a server without a GPU (as --require-gpu)."
    ).tag(config=True)
    local_args = List(
        Unicode(),
        # No --sandbox: the default (auto) confines cells wherever bubblewrap works.
        default_value=["--device", "auto", "--log-dir", ""],
        help="Extra arguments of the embedded `kcoral server` (after --port 0 --ready-file).",
    ).tag(config=True)
    local_start_timeout = Float(120.0, help="Seconds to wait for the embedded server.").tag(
        config=True
    )

    @default("url")
    def _default_url(self) -> str:
        return os.environ.get("KCORAL_URL", "").strip()

    @default("token")
    def _default_token(self) -> str:
        return os.environ.get("KCORAL_TOKEN", "")

    def __repr__(self) -> str:
        token = "<set>" if self.token else "<unset>"
        return f"KCoral(url={self.url!r}, token={token})"

    def describe(self) -> dict[str, Any]:
        """The settings for display; the token only as set/unset."""
        return {
            "url": self.url or "(local server)",
            "token": "set" if self.token else "unset",
            "timeout": self.timeout,
            "output_limit": self.output_limit,
            "use_jobs": self.use_jobs,
            "quiet": self.quiet,
            "verbose_errors": self.verbose_errors,
            "require_gpu": self.require_gpu,
        }
