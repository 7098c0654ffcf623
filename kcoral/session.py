"""State a program keeps for the next program of its session (EXTENSIONS §11).

Inside a session every program runs in the same worker process, so this module (and the
objects ``namespace`` references: tensors keep their device memory) outlives each program::

    import kcoral.session

    model = kcoral.session.namespace.get("model")
    if model is None:
        model = kcoral.session.namespace["model"] = build_model()

Outside a session a program runs on a fresh worker and finds ``namespace`` empty.
"""

from __future__ import annotations

from typing import Any

#: the session's state: whatever one program stores here, the next program finds
namespace: dict[str, Any] = {}
