"""Process state a reused worker puts back between programs (SERVER §6 reuse policy), and
where a session's ``SIGINT`` goes (``InterruptGate``)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import warnings
from collections.abc import Iterator
from types import FrameType
from typing import Any

_RESTORED_SIGNALS = tuple(
    getattr(signal, name)
    for name in (
        "SIGTERM",
        "SIGINT",
        "SIGHUP",
        "SIGCHLD",
        "SIGPIPE",
        "SIGALRM",
        "SIGUSR1",
        "SIGUSR2",
    )
    if hasattr(signal, name)
)


def _environ_pointer() -> Any:
    """libc's ``environ`` (a ``char **``), looked up once: ``CDLL(None)`` is a ``dlopen``."""
    try:
        libc = ctypes.CDLL(None)
        return ctypes.POINTER(ctypes.c_char_p).in_dll(libc, "environ")
    except (OSError, ValueError):
        return None


_ENVIRON = _environ_pointer()


def _native_environ() -> dict[bytes, bytes] | None:
    """The C-level environment (``setenv`` by native code bypasses ``os.environ``)."""
    if _ENVIRON is None:
        return None
    # ``in_dll`` maps the variable itself: it reads ``environ``'s current value, also after
    # ``setenv`` moved the array
    pointer = _ENVIRON
    result: dict[bytes, bytes] = {}
    index = 0
    while pointer and pointer[index] is not None:
        key, _sep, value = pointer[index].partition(b"=")
        result.setdefault(key, value)
        index += 1
    return result


class ProcessSnapshot:
    """The post-start state of the worker process."""

    def __init__(self) -> None:
        self.environ = dict(os.environb)
        self.cwd = os.getcwd()
        self.sys_path = list(sys.path)
        self.umask = os.umask(0o077)
        os.umask(self.umask)
        self.signals = {sig: signal.getsignal(sig) for sig in _RESTORED_SIGNALS}
        self.torch: dict[str, Any] | None = None
        if "torch" in sys.modules:
            self.torch = _torch_settings()

    def restore(self) -> None:
        """Put every piece back; each piece is best effort so one failure spoils nothing."""
        with contextlib.suppress(OSError):
            os.chdir(self.cwd)
        self._restore_environ()
        sys.path[:] = self.sys_path
        os.umask(self.umask)
        with contextlib.suppress(OSError, ValueError):
            signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in self.signals.items():
            with contextlib.suppress(OSError, ValueError, TypeError):
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if "torch" in sys.modules:
            if self.torch is None:
                # torch arrived during a program: the post-start state is torch's defaults
                _apply_torch_settings(_TORCH_DEFAULTS)
                self.torch = _torch_settings()
            else:
                _apply_torch_settings(self.torch)

    def _restore_environ(self) -> None:
        wanted = self.environ
        # ``os.environb`` is a Mapping over a plain dict: one C-level comparison finds the
        # usual case (nothing changed) instead of ~50 Python-level lookups per program.
        if getattr(os.environb, "_data", None) != wanted:
            for key in list(os.environb):
                if key not in wanted:
                    del os.environb[key]
            for key, value in wanted.items():
                if os.environb.get(key) != value:
                    os.environb[key] = value
        native = _native_environ()
        if native is None or native == wanted:
            return
        for key, value in native.items():
            if key not in wanted:
                with contextlib.suppress(OSError, ValueError):
                    os.unsetenv(key)
            elif value != wanted[key]:
                with contextlib.suppress(OSError, ValueError):
                    os.putenv(key, wanted[key])
        for key, value in wanted.items():
            if key not in native:
                with contextlib.suppress(OSError, ValueError):
                    os.putenv(key, value)


# Values a freshly imported torch starts with (used when torch was first imported by a
# program, so there is no earlier snapshot to return to).
_TORCH_DEFAULTS: dict[str, Any] = {
    "default_dtype": "float32",
    "grad_enabled": True,
    "deterministic": (False, False),
    "matmul_precision": "highest",
    "default_device": None,
    "cuda.matmul.allow_tf32": False,
    "cuda.matmul.allow_fp16_reduced_precision_reduction": True,
    "cuda.matmul.allow_bf16_reduced_precision_reduction": True,
    "cudnn.enabled": True,
    "cudnn.benchmark": False,
    "cudnn.deterministic": False,
    "cudnn.allow_tf32": True,
}

_BACKEND_FLAGS = (
    ("cuda.matmul", "allow_tf32"),
    ("cuda.matmul", "allow_fp16_reduced_precision_reduction"),
    ("cuda.matmul", "allow_bf16_reduced_precision_reduction"),
    ("cudnn", "enabled"),
    ("cudnn", "benchmark"),
    ("cudnn", "deterministic"),
    ("cudnn", "allow_tf32"),
)


def _backend(torch: Any, dotted: str) -> Any:
    target = torch.backends
    for part in dotted.split("."):
        target = getattr(target, part)
    return target


def _torch_settings() -> dict[str, Any]:
    torch = sys.modules["torch"]
    settings: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation notes would land in captured stderr
        with contextlib.suppress(Exception):
            settings["default_dtype"] = str(torch.get_default_dtype()).removeprefix("torch.")
        with contextlib.suppress(Exception):
            settings["grad_enabled"] = torch.is_grad_enabled()
        with contextlib.suppress(Exception):
            settings["deterministic"] = (
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
            )
        with contextlib.suppress(Exception):
            settings["matmul_precision"] = torch.get_float32_matmul_precision()
        with contextlib.suppress(Exception):
            device = torch.get_default_device()
            settings["default_device"] = None if device.type == "cpu" else str(device)
        for module, flag in _BACKEND_FLAGS:
            with contextlib.suppress(Exception):
                settings[f"{module}.{flag}"] = bool(getattr(_backend(torch, module), flag))
    return settings


def _apply_torch_settings(wanted: dict[str, Any]) -> None:
    """Set the torch settings of ``wanted`` that differ from torch's current ones.

    Only the differing ones: a setter is not free even when it changes nothing, and
    ``torch.use_deterministic_algorithms`` imports ``torch._inductor.config`` (sympy and
    ~800 modules, seconds of CPU) on its first call. After a program that imported torch
    (a session's first cell) the worker's clean-up called it, and the next program waited
    for that (issue 29.9); reading every setting costs well under a millisecond."""
    current = _torch_settings()
    settings = {key: value for key, value in wanted.items() if current.get(key) != value}
    torch = sys.modules["torch"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if "default_dtype" in settings:
            with contextlib.suppress(Exception):
                torch.set_default_dtype(getattr(torch, settings["default_dtype"]))
        if "grad_enabled" in settings:
            with contextlib.suppress(Exception):
                torch.set_grad_enabled(settings["grad_enabled"])
        if "deterministic" in settings:
            mode, warn_only = settings["deterministic"]
            with contextlib.suppress(Exception):
                torch.use_deterministic_algorithms(mode, warn_only=warn_only)
        if "matmul_precision" in settings:
            with contextlib.suppress(Exception):
                torch.set_float32_matmul_precision(settings["matmul_precision"])
        if "default_device" in settings:
            with contextlib.suppress(Exception):
                torch.set_default_device(settings["default_device"])
        for module, flag in _BACKEND_FLAGS:
            key = f"{module}.{flag}"
            if key in settings:
                with contextlib.suppress(Exception):
                    setattr(_backend(torch, module), flag, settings[key])


class InterruptGate:
    """Where a ``SIGINT`` goes: into uploaded code, to its next call, or nowhere
    (EXTENSIONS §11, Interrupts).

    A session's interrupt is ``SIGINT`` to its worker. Python's default handler raises
    ``KeyboardInterrupt`` wherever the worker happens to be, and a signal that landed in the
    worker's own code (sending the answer, cleaning up, waiting for the next program) ended
    the worker and with it the session's state: an interrupt a moment after a cell ended
    lost the whole session (seen in CI). So the worker raises it only inside uploaded code
    (``user_code``); one that lands in the worker's own code while a program runs is raised
    as that program's next uploaded code starts; one that lands between programs is
    dropped: the program it was meant for has ended. The front-end sends the signal only
    once the worker has started the program (``Session.interrupt``), so an interrupt
    is never dropped before its program begins.

    Who can reach it: the front-end (``kill`` as the same user) and the worker's own
    programs; uploaded code that installs its own ``SIGINT`` handler replaces this one for
    that program only (``ProcessSnapshot`` restores it after each program)."""

    def __init__(self) -> None:
        self.in_program = False
        self.in_user_code = False
        self.pending = False  # arrived during this program, outside uploaded code

    def install(self) -> None:
        """Handle ``SIGINT`` here from now on (before the worker's state snapshot, which
        restores the handler after every program)."""
        signal.signal(signal.SIGINT, self.on_signal)

    def on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        if self.in_user_code:
            self.pending = False
            raise KeyboardInterrupt
        if self.in_program:
            self.pending = True  # raised as the program's next uploaded code starts

    @contextlib.contextmanager
    def program(self) -> Iterator[None]:
        """One program: what arrives after it belongs to no program and is dropped."""
        self.pending = False
        self.in_program = True
        try:
            yield
        finally:
            self.in_program = False
            self.pending = False

    @contextlib.contextmanager
    def user_code(self) -> Iterator[None]:
        """Uploaded code runs: an interrupt that came while the worker's own code ran in this
        program is raised now, and one that comes while it runs is raised in it."""
        self.in_user_code = True
        try:
            if self.pending:
                self.pending = False
                raise KeyboardInterrupt
            yield
        finally:
            self.in_user_code = False
