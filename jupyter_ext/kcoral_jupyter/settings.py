"""Settings of the IPython extension, as traitlets (``%config KCoral.url = ...``).

Precedence: a value set by ``%config`` or a config file > the environment variables
``KCORAL_URL`` / ``KCORAL_TOKEN`` > defaults. The token is never shown: ``%config KCoral``
lists its current value only as ``<set>`` or ``<unset>`` (``class_get_trait_help``), and so
do ``describe`` (``%kcoral status``) and ``repr``.
"""

from __future__ import annotations

import os
from typing import Any

from traitlets import Bool, Float, Int, List, TraitType, Unicode, default
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

    @classmethod
    def class_get_trait_help(
        cls,
        trait: TraitType[Any, Any],
        inst: Any = None,
        helptext: str | None = None,
    ) -> str:
        """``%config KCoral``'s entry of ``trait``: traitlets ends it with ``Current:`` and the
        value's repr, which for the token put the user's secret into the notebook, saved with
        it; the token's is ``<set>`` or ``<unset>``."""
        text = super().class_get_trait_help(trait, inst, helptext)
        if trait.name != "token" or inst is None:
            return text
        hidden = "<set>" if getattr(inst, "token", "") else "<unset>"
        lines = text.splitlines()
        for index, line in enumerate(lines):
            if line.lstrip().startswith("Current: "):
                lines[index] = line[: len(line) - len(line.lstrip())] + f"Current: {hidden}"
        return "\n".join(lines)

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
