"""The fork server's ``weakref.finalize`` callbacks, and a forked worker's exit walk over them.

torch registers ~130 finalizers as it loads (one per operator library); they only tidy
registries of the exiting process itself. The preload marks them not to run at exit
(``keep_preload_finalizers_from_exit``), so a worker's exit runs only its program's own.
Still, weakref's exit hook walks the whole registry to find those: in a forked worker that
walk writes to every entry (references taken while iterating), copying ~150 pages shared
with the launcher, ~0.6 ms on the request path of every one-shot worker, whose exit report
waits for its exit handlers (SERVER §8). ``skip_idle_exit_walk`` leaves the hook out when no
finalizer made since the preload is due at exit, so there is nothing it could call; it
finds those from the registry's newest end, touching none of the preload's.

Who can reach what: only a program that digs the launcher's own finalizers out of
weakref's private registry and marks one ``atexit`` again loses that callback at exit; its
own finalizers (any made after the fork) always run.
"""

from __future__ import annotations

import atexit
import contextlib
import re
import weakref

#: the next finalizer index once the preload's were marked; None: never marked here
_marked_up_to: int | None = None


def keep_preload_finalizers_from_exit() -> int:
    """Mark the ``weakref.finalize`` callbacks registered so far as not run at exit; returns
    how many. torch registers one per operator library (~130, ~25-80 ms at every worker's
    exit, which a transient worker's next request waits for); they only tidy registries of
    the exiting process itself. A program's own finalizers still run at its exit."""
    global _marked_up_to
    registry = getattr(weakref.finalize, "_registry", {})  # no public way to list them
    marked = 0
    for finalizer in list(registry):
        with contextlib.suppress(AttributeError, TypeError):
            if finalizer.atexit:
                finalizer.atexit = False
                marked += 1
    _marked_up_to = _next_index()
    return marked


def skip_idle_exit_walk() -> bool:
    """In a forked worker about to run its exit handlers: when no finalizer made since the
    preload marked its own is due at exit, unregister weakref's exit hook (nothing it
    could call) so its walk copies no page; True when it was left out."""
    if _marked_up_to is None or _due_since_marked(_marked_up_to):
        return False
    atexit.unregister(weakref.finalize._exitfunc)  # type: ignore[attr-defined]
    return True


def _due_since_marked(first: int) -> bool:
    """Whether a finalizer numbered ``first`` or later is still to run at exit. The
    registry is a dict in the order finalizers were made, so the walk goes from its end
    and stops at the first older one."""
    registry = getattr(weakref.finalize, "_registry", {})
    for info in reversed(registry.values()):
        if info.index < first:
            return False
        if info.atexit:
            return True
    return False


def _next_index() -> int | None:
    """The index the next ``weakref.finalize`` gets (its private counter, read without
    advancing it); None when that counter is not there or reads differently."""
    counter = getattr(weakref.finalize, "_index_iter", None)
    found = re.fullmatch(r"count\((\d+)\)", repr(counter))
    return int(found.group(1)) if found else None
