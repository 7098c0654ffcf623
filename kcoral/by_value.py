"""Which loaded modules a pickle for the server carries by value (EXTENSIONS §4): those the
server cannot import, a user's script or helper modules; ``kcoral.remote.pickled.dump_by_value``
registers them with cloudpickle for one dump."""

from __future__ import annotations

import functools
import sys
import types
from pathlib import Path

_by_value_seen: tuple[tuple[int, str | None], list[types.ModuleType]] = ((0, None), [])


def modules_by_value() -> list[types.ModuleType]:
    """The loaded modules ``_sent_by_value`` picks, worked out again only when a module was
    loaded or dropped since (``sys.modules`` keeps insertion order: its size and last name
    tell). Walking every module on each call cost 0.17 ms a call with torch loaded. The
    caller holds ``kcoral.remote.pickled``'s by-value lock."""
    global _by_value_seen
    modules = sys.modules
    fingerprint = (len(modules), next(reversed(modules), None))
    seen, picked = _by_value_seen
    if fingerprint != seen:
        picked = [
            module
            for name, module in list(modules.items())
            if isinstance(module, types.ModuleType) and _sent_by_value(name, module)
        ]
        _by_value_seen = (fingerprint, picked)
    return picked


@functools.lru_cache(maxsize=8192)
def _sent_by_value(name: str, module: types.ModuleType) -> bool:
    """Whether the loaded ``module`` (``sys.modules[name]``) is one the server cannot import:
    not ``__main__`` (cloudpickle sends it by value anyway), nor KCoral's, the standard
    library's or an installed package's (judged by its file or its top package's: some
    of torch's have none). Those travel by reference, as cloudpickle sends them: the server
    has them too, and by value they do not survive (``json.dumps``, ``functools.partial``
    objects, ``operator.itemgetter``: their modules hold classes cloudpickle cannot copy)."""
    if module.__name__ != name:
        return False
    top = name.partition(".")[0]
    if name in ("__main__", "builtins") or top.startswith("kcoral"):
        return False
    if top in sys.stdlib_module_names:
        return False
    files = (getattr(module, "__file__", None), getattr(sys.modules.get(top), "__file__", None))
    installed = {"site-packages", "dist-packages"}
    return not any(installed & set(Path(str(file)).parts) for file in files if file)
