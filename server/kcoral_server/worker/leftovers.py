"""Threads a program leaves running (SERVER §8, EXTENSIONS §11).

A thread that outlives its program would run on in the worker after the GPU lease is
released: on a reused worker (a session's, or ``--max-requests-per-worker`` above 1) it
could launch GPU work while another program holds the GPU, or read the next program's
data. A thread cannot be killed from outside, so the worker refuses it the only way it can:
at the program's end (under the lease) each thread started during the program gets a short
grace to finish; one still alive after it fails the program and retires the worker, whose
exit ends the thread (leftover processes are killed instead: ``reaper``, and the front-end's
``kcoral_server.processes.strays``).

Who can reach what: the program runs in this interpreter and can edit ``threading``'s
bookkeeping (``threading._active``) or start threads beneath it
(``_thread.start_new_thread``), so the census is taken from the interpreter itself: the
thread states that run Python code (``sys._current_frames()``, told apart by the bottom
frame of each thread's stack, which lives as long as the thread) and the count of threads
the ``_thread`` module started (``_thread._count()``, which also counts a thread running a C
function and hence no frame). A thread just started has a thread state but neither a frame
nor a place in that count until it first takes the GIL: while the interpreter lists more
thread states than the census explains (``PyThreadState_Next``), the check sleeps (so the
GIL is free) for at most ``STARTING_SECONDS`` to let such a thread show itself.
``threading``'s list only lends names and joins. The functions are taken when the worker
imports this module, before any program could replace them.

Native threads a library starts for itself (thread pools of BLAS, OpenMP, CUDA, torch) have
no Python thread state and are not counted: they are the library's, kept idle between
programs, and never fail a program (they would fail every honest program that first
multiplies two matrices).
"""

from __future__ import annotations

import _thread
import asyncio
import ctypes
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

#: how long threads started by a program may take to finish after it (they may be ending)
THREAD_GRACE_SECONDS = 2.0
#: how often the census is taken again while unjoinable threads may still be ending
POLL_SECONDS = 0.01
#: the longest a thread state without a thread to explain it is waited for: a thread that
#: is starting shows itself once it gets the GIL; a native thread that keeps a thread state
#: for its life (torch's autograd device threads) never does and must not fail anything
STARTING_SECONDS = 0.5

_current_frames = sys._current_frames
_python_thread_count = _thread._count


def _thread_state_counter() -> Callable[[], int] | None:
    """A function counting this interpreter's thread states (None where ctypes cannot)."""
    try:
        api = ctypes.pythonapi
        get = api.PyInterpreterState_Get
        head = api.PyInterpreterState_ThreadHead
        following = api.PyThreadState_Next
    except (AttributeError, OSError):
        return None
    get.restype = ctypes.c_void_p
    head.argtypes, head.restype = [ctypes.c_void_p], ctypes.c_void_p
    following.argtypes, following.restype = [ctypes.c_void_p], ctypes.c_void_p

    def count() -> int:
        # called with the GIL held (pythonapi keeps it), so the list cannot change meanwhile
        state, found = head(get()), 0
        while state:
            found += 1
            state = following(state)
        return found

    return count


_thread_states = _thread_state_counter()


def _state_count() -> int:
    return _thread_states() if _thread_states is not None else 0


@dataclass(frozen=True)
class ThreadCensus:
    """The Python threads alive at one moment (taken when a program starts)."""

    #: ``threading``'s objects (for joins and names)
    objects: frozenset[threading.Thread]
    #: thread ident -> the bottom frame of its stack (a reused ident has another one)
    roots: dict[int, FrameType]
    #: threads started by ``_thread`` (``threading`` included), the main one excluded
    count: int
    #: the interpreter's thread states (0 where they cannot be counted)
    states: int = 0


def _root(frame: FrameType) -> FrameType:
    while frame.f_back is not None:
        frame = frame.f_back
    return frame


def live_threads() -> ThreadCensus:
    """The Python threads alive now."""
    frames = _current_frames()
    return ThreadCensus(
        objects=frozenset(threading.enumerate()),
        roots={ident: _root(frame) for ident, frame in frames.items()},
        count=_python_thread_count(),
        states=_state_count(),
    )


def _new_frames(before: ThreadCensus) -> dict[int, FrameType]:
    """Bottom frames of threads running Python code now that were not running at ``before``
    (the caller's own thread excluded)."""
    current = threading.get_ident()
    found = {}
    for ident, frame in _current_frames().items():
        if ident == current:
            continue
        root = _root(frame)
        if before.roots.get(ident) is not root:
            found[ident] = root
    return found


def _name(ident: int, root: FrameType) -> str:
    """A thread's ``threading`` name when it has a ``threading.Thread`` (listed or not),
    else the function it runs."""
    listed = threading._active.get(ident)  # type: ignore[attr-defined]
    if isinstance(listed, threading.Thread) and not isinstance(
        listed,
        threading._DummyThread,
    ):
        return listed.name
    if root.f_code is threading.Thread._bootstrap.__code__:  # type: ignore[attr-defined]
        try:
            owner = root.f_locals.get("self")
        except Exception:  # a frame of another thread: never let naming fail the census
            owner = None
        if isinstance(owner, threading.Thread):
            return owner.name
    return f"<thread running {root.f_code.co_name}>"


def leftover_threads(
    before: ThreadCensus,
    loop: asyncio.AbstractEventLoop | None = None,
    grace: float = THREAD_GRACE_SECONDS,
) -> list[str]:
    """Names of the Python threads started since ``before`` still alive after ``grace``
    seconds (a thread without a Python frame counts, unnamed).

    The idle threads of ``loop``'s default executor (``asyncio.to_thread``) are the loop's,
    not leftovers: the executor is let go (its threads end once idle; the loop makes a new
    one when asked), and a thread of it still busy after the grace counts like any other.
    Without new threads this reads the census once and never sleeps.
    """
    if loop is not None:
        executor = getattr(loop, "_default_executor", None)
        if executor is not None:
            loop._default_executor = None  # type: ignore[attr-defined]
            executor.shutdown(wait=False)
    deadline = time.monotonic() + grace
    current = threading.current_thread()
    joinable = [
        thread
        for thread in threading.enumerate()
        if thread not in before.objects
        and thread is not current
        and not isinstance(thread, threading._DummyThread)
    ]
    for thread in joinable:
        thread.join(max(0.0, deadline - time.monotonic()))
    # Threads ``threading`` does not know of cannot be joined: look again until they end.
    starting_until = min(deadline, time.monotonic() + STARTING_SECONDS)
    while True:
        frames = _new_frames(before)
        extra = _python_thread_count() - before.count
        now = time.monotonic()
        if frames or extra > 0:
            if now >= deadline:
                break
        elif _state_count() - before.states <= 0 or now >= starting_until:
            break  # nothing left, or only thread states no thread of the program explains
        time.sleep(POLL_SECONDS)
    names = sorted({_name(ident, root) for ident, root in frames.items()})
    # threads running a C function have no frame: only the count shows them
    unseen = extra - len(frames)
    if unseen > 0:
        names.append(f"<{unseen} thread(s) running native code>")
    return names


def thread_message(names: list[str]) -> str:
    """The ``runtime`` error of a program that left threads running."""
    listed = ", ".join(repr(name) for name in names[:5])
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return (
        f"program left threads running after it ended ({listed}{more}); "
        "the worker was retired to stop them"
    )
