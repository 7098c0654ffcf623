"""Remote functions: a decorated Python function run on the server (CLIENT_API.md §8).

Two formats (EXTENSIONS.md §4): ``json`` uploads the function's source (``remote_source``),
JSON literals and whole binary arguments; ``pickle`` sends the function and its arguments by
value (cloudpickle, imported only then) in one ``bytes`` upload, which the server's
trampoline (``kcoral_server.worker.trampoline``) runs, pickling the result back. Pickle
payloads carry an envelope naming the writer's Python and cloudpickle versions
(``kcoral.protocol.pickle_envelope``, whose names older ``%%kcoral`` code imports from here);
the client unpickles only what a call asked for in pickle (``load_requested``).
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
import threading
import types
from collections.abc import Callable, Coroutine, Mapping, Set
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypeVar, overload

from kcoral.blocking import run_blocking
from kcoral.by_value import modules_by_value
from kcoral.connection.in_flight import call_cuttable
from kcoral.errors import KCoralError, ProtocolError, RemoteExecutionError
from kcoral.program import Program, plain_scalars
from kcoral.protocol.headers import SERIALIZATION_FORMATS
from kcoral.protocol.pickle_envelope import PickleVersionError, dump_envelope, load_envelope
from kcoral.protocol.selector import SelectorInput, check_select
from kcoral.remote_report import deadline_said, interrupted, note_remote_traceback, show_output
from kcoral.remote_source import dispatcher_name, json_module_source
from kcoral.results import ProgramResult

if TYPE_CHECKING:
    from kcoral.async_client import AsyncClient
    from kcoral.client import Client
    from kcoral.client_sessions import AsyncSession, Session

    #: What a remote function runs through (``is_async`` tells the two kinds apart).
    RemoteCaller: TypeAlias = Client | AsyncClient | Session | AsyncSession

T = TypeVar("T")

#: Keyword arguments of ``remote``/``execute`` themselves, so no parameter may use them.
RESERVED_PARAMETERS = ("run_async", "serialization")


def _asked_async(run_async: object) -> bool:
    """``run_async`` checked: ``"yes"`` (any truthy non-bool) returned a coroutine that a
    caller not awaiting it never ran."""
    if type(run_async) is not bool:
        raise TypeError(f"run_async must be True or False, not {run_async!r}")
    return run_async


#: What a pickle-mode program imports on the server.
TRAMPOLINE_SOURCE = "from kcoral_server.worker.trampoline import call_pickled\n"
TRAMPOLINE_FUNCTION = "call_pickled"


def load_requested(
    payloads: Mapping[str, object], allowed: Set[str], *, what: str
) -> dict[str, Any]:
    """Unpickle server envelopes, but only those under a name in ``allowed``.

    ``allowed`` is what this call asked for in pickle format (empty when it asked for none).
    Every name and every payload is checked before the first one is unpickled, so an answer
    carrying one name too many unpickles nothing: ``ProtocolError`` naming ``what`` (e.g.
    "request <id>") and the names. A payload that is not an envelope, or comes from other
    Python/cloudpickle versions, is a ``ProtocolError`` too.
    """
    if not isinstance(payloads, Mapping):
        raise ProtocolError(
            f"{what}: pickled values must be an object of names (one envelope each), not a "
            f"{type(payloads).__name__}; nothing was unpickled"
        )
    unexpected = sorted(str(name) for name in payloads if name not in allowed)
    if unexpected:
        raise ProtocolError(
            f"{what}: the server sent pickled values for {unexpected}, which this call did not "
            "ask for in pickle format; nothing was unpickled"
        )
    envelopes: dict[str, bytes] = {}
    for name, data in payloads.items():
        if not isinstance(data, bytes):
            raise ProtocolError(
                f"{what}: pickled value {name!r} is a {type(data).__name__}, not bytes; "
                "nothing was unpickled"
            )
        envelopes[name] = data
    values: dict[str, Any] = {}
    for name, data in envelopes.items():
        try:
            values[name] = load_envelope(data, writer="server", reader="client")
        except PickleVersionError as exc:
            raise ProtocolError(f"{what}: {exc}") from None
        except Exception as exc:  # e.g. a class the client cannot import, or no envelope
            reason = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, RuntimeError) and "object on a CUDA device" in str(exc):
                # Not torch's advice (torch.load(map_location=...)): the caller calls no load.
                reason = (
                    "it holds a CUDA tensor and this machine has no CUDA; return it moved to "
                    "the CPU (tensor.cpu()) from the function"
                )
            raise ProtocolError(f"{what}: cannot unpickle {name!r}: {reason}") from exc
    return values


_BY_VALUE_LOCK = threading.Lock()


def _dump_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    return dump_by_value((fn, args, kwargs))


def _unpicklable_part(
    fn: Callable[..., Any],
    bound: inspect.BoundArguments | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[str, Exception] | None:
    """Which part of a call that failed to pickle is the cause, and its error: cloudpickle's
    own (``cannot pickle '_thread.lock' object``) named no argument, nor the function's
    globals. ``None`` when each part pickles alone."""
    if bound is None:
        labels = [f"argument {index}" for index in range(len(args))]
        values = [*args, *kwargs.values()]
    else:
        labels = _argument_labels(bound, set(bound.arguments))
        values = [*bound.args, *bound.kwargs.values()]
        kwargs = bound.kwargs
    parts = [("the function (with the globals and closure it uses)", fn)]
    parts += zip(labels + [f"argument {name!r}" for name in kwargs], values, strict=True)
    for label, value in parts:
        try:
            dump_by_value(value)
        except Exception as exc:
            return label, exc
    return None


def dump_by_value(value: Any) -> bytes:
    """``dump_envelope(value)``, every loaded module the server cannot import by value.

    cloudpickle sends functions and classes of importable modules by reference, which the
    server cannot resolve for a user's script or helper module; registering those modules by
    value for this one dump sends the code itself ("by value", EXTENSIONS §4). Every such
    module, not only a remote function's own: a ``functools.partial`` of a helper function,
    or an argument (a ``%%kcoral -i`` value) whose class lives in a helper module, use it too.
    """
    import cloudpickle

    with _BY_VALUE_LOCK:
        registered = set(cloudpickle.list_registry_pickle_by_value())
        modules = [module for module in modules_by_value() if module.__name__ not in registered]
        for module in modules:
            cloudpickle.register_pickle_by_value(module)
        try:
            return dump_envelope(value)
        finally:
            for module in modules:
                cloudpickle.unregister_pickle_by_value(module)


# ---------------------------------------------------------------------- argument checks


def _argument_labels(bound: inspect.BoundArguments, given: set[str]) -> list[str]:
    """How an error names each of ``bound.args``: by its parameter (``argument 'pair'``,
    ``argument 'rest'[1]`` for ``*rest``), with ``(its default)`` for a default the client
    bound; an index is meaningless for a default the caller never passed."""
    labels: list[str] = []
    for name, parameter in bound.signature.parameters.items():
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            labels.append(f"argument {name!r}" + ("" if name in given else " (its default)"))
        elif parameter.kind is parameter.VAR_POSITIONAL:
            rest = bound.arguments.get(name, ())
            labels.extend(f"argument {name!r}[{index}]" for index in range(len(rest)))
    if len(labels) != len(bound.args):  # never expected: fall back to positions
        return [f"argument {index}" for index in range(len(bound.args))]
    return labels


def _is_binary(value: Any) -> bool:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return True
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        return True
    return hasattr(value, "__dlpack__")  # torch tensors included


def _check_json(value: Any, where: str, active: set[int]) -> None:
    """``value`` must be plain JSON: exact types, finite floats, no cycles, no binary."""
    kind = type(value)
    if kind is str:
        _check_text(value, where)
        return
    if value is None or kind in (bool, int):
        return
    if kind is float:
        if not math.isfinite(value):
            raise ValueError(f"{where} is a non-finite float ({value!r}); JSON cannot carry it")
        return
    if kind is list or kind is dict:
        if id(value) in active:
            raise ValueError(f"{where} contains a cycle")
        active.add(id(value))
        if kind is list:
            if not plain_scalars(value):  # else each item is checked, naming its index
                for index, item in enumerate(value):
                    _check_json(item, f"{where}[{index}]", active)
        else:
            for key, item in value.items():
                if type(key) is not str:
                    raise TypeError(f"{where} has a {type(key).__name__} key; JSON keys are str")
                _check_text(key, f"a key of {where}")
                _check_json(item, f"{where}[{key!r}]", active)
        active.discard(id(value))
        return
    if _is_binary(value):
        raise TypeError(
            f"{where} is binary data inside a container; bytes and arrays must be whole "
            "arguments in JSON mode (or use serialization='pickle')"
        )
    raise TypeError(
        f"{where} is a {kind.__name__}, not a JSON value (None, bool, int, float, str, list, "
        "dict with str keys); use serialization='pickle' for other objects"
    )


def _check_call_options(timeout: object, output_limit_bytes: object) -> None:
    """The decorator's ``timeout`` and ``output_limit_bytes``, checked where they are
    written: a bad one failed only at the first call, as the server's 400 about
    ``timeout_seconds``, a name the user never wrote."""
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a number of seconds > 0, not {timeout!r}")
    if output_limit_bytes is not None:
        if isinstance(output_limit_bytes, bool) or not isinstance(output_limit_bytes, int):
            kind = type(output_limit_bytes).__name__
            raise TypeError(f"output_limit_bytes must be an int, not {kind}")
        if output_limit_bytes < 0:
            raise ValueError(f"output_limit_bytes must be >= 0, not {output_limit_bytes!r}")


def _check_text(text: str, where: str) -> None:
    """A ``str`` the request's UTF-8 can carry: a lone surrogate (``'\\udc80'``, from
    ``surrogateescape`` decoding) failed later as 'cannot encode the request' at a byte
    position of the whole request, naming no argument."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{where} holds a lone surrogate at position {exc.start} ({text[exc.start]!r}); "
            "UTF-8 cannot carry it (bytes travel as bytes arguments)"
        ) from None


def _check_serialization(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if value not in SERIALIZATION_FORMATS:
        raise ValueError(f"{what} must be one of {list(SERIALIZATION_FORMATS)}, not {value!r}")
    return value


def _plain_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    return fn


# ------------------------------------------------------------------------ RemoteFunction


class RemoteFunction:
    """A function that runs locally when called and remotely through ``remote``."""

    # set by functools.update_wrapper
    __wrapped__: Callable[..., Any]
    __name__: str

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        client: RemoteCaller,
        timeout: float | None = None,
        output_limit_bytes: int | None = None,
        cpu_only: bool = False,
        serialization: str = "json",
        select: SelectorInput = None,
    ) -> None:
        serialization = _check_serialization(serialization, "serialization")
        self.select = check_select(select)  # sent with every call (EXTENSIONS §14)
        if serialization == "json" and not isinstance(fn, types.FunctionType):
            raise TypeError(f"a remote function must be a Python function, not {type(fn).__name__}")
        if not callable(fn):
            raise TypeError(f"a remote function must be callable, not {type(fn).__name__}")
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError("a generator function cannot be a remote function: return a list")
        if not isinstance(cpu_only, bool):
            raise TypeError(f"cpu_only must be a bool, not {type(cpu_only).__name__}")
        _check_call_options(timeout, output_limit_bytes)
        try:
            self._signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):  # some callables have none; pickle mode copes
            self._signature = None
        reserved = self._reserved_parameters()
        if reserved:
            raise ValueError(
                f"remote function parameters may not be named {' or '.join(reserved)}: "
                "remote() and execute() use these keywords"
            )
        self._client = client
        self.timeout = timeout
        self.output_limit_bytes = output_limit_bytes
        self.cpu_only = cpu_only
        self.serialization = serialization
        self._is_async = inspect.iscoroutinefunction(fn)
        self._json_source: str | None = None
        if serialization == "json":
            self._json_source = json_module_source(fn)  # type: ignore[arg-type]
        functools.update_wrapper(self, fn)

    def _reserved_parameters(self) -> list[str]:
        if self._signature is None:
            return []
        return [name for name in RESERVED_PARAMETERS if name in self._signature.parameters]

    def __repr__(self) -> str:
        return f"<RemoteFunction {self.__wrapped__!r} serialization={self.serialization!r}>"

    def __reduce__(self) -> tuple[Any, ...]:
        # A pickle-mode function that calls itself finds this object among its globals;
        # remotely it must be the plain function (the client and its sockets stay here).
        return (_plain_function, (self.__wrapped__,))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the original function locally."""
        return self.__wrapped__(*args, **kwargs)

    # -- building -----------------------------------------------------------------------

    def build_program(self, *args: Any, serialization: str | None = None, **kwargs: Any) -> Program:
        """The program one remote call sends (``TypeError`` when arguments do not bind)."""
        return self._build(args, kwargs, self._format(serialization))

    def _format(self, serialization: str | None) -> str:
        if serialization is None:
            return self.serialization
        return _check_serialization(serialization, "serialization")

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> inspect.BoundArguments | None:
        if self._signature is None:
            return None
        try:
            return self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.__name__}(): {exc}") from None

    def _build(self, args: tuple[Any, ...], kwargs: dict[str, Any], fmt: str) -> Program:
        bound = self._bind(args, kwargs)
        if fmt == "pickle":
            return self._pickle_program(args, kwargs)
        assert bound is not None  # JSON mode only accepts Python functions
        return self._json_program(bound)

    def _module_source(self) -> str:
        if self._json_source is None:  # decorated for pickle; checked on first JSON call
            fn = self.__wrapped__
            if not isinstance(fn, types.FunctionType):
                raise TypeError(f"JSON mode needs a Python function, not {type(fn).__name__}")
            self._json_source = json_module_source(fn)
        return self._json_source

    def _json_program(self, bound: inspect.BoundArguments) -> Program:
        source = self._module_source()
        given = set(bound.arguments)
        bound.apply_defaults()  # defaults are bound here and sent explicitly (§8)
        positional = list(bound.args)
        keywords = dict(bound.kwargs)
        values = positional + list(keywords.values())
        labels = _argument_labels(bound, given) + [f"argument {name!r}" for name in keywords]
        for value, label in zip(values, labels, strict=True):
            if not _is_binary(value):
                try:
                    _check_json(value, label, set())
                except RecursionError:  # as Program.run says it (a bare RecursionError before)
                    raise ValueError(f"{label} is nested too deeply") from None

        program = Program()
        module = program.upload(id="module", kind="module", source=source)
        function = program.get_function(
            id="function",
            module=module,
            name=dispatcher_name(self.__wrapped__),
            cpu_only=self.cpu_only,
        )
        run_values: list[Any] = []
        literals: list[bool] = []
        for index, (value, label) in enumerate(zip(values, labels, strict=True)):
            if isinstance(value, (bytes, bytearray, memoryview)):
                run_values.append(program.upload(id=f"arg_{index}", kind="bytes", value=value))
                literals.append(False)
            elif _is_binary(value):
                try:
                    upload = program.upload(id=f"arg_{index}", kind="tensor", value=value)
                except ValueError as exc:  # it named neither the argument nor the way out
                    raise ValueError(f"{label}: {exc}; use serialization='pickle'") from None
                run_values.append(upload)
                literals.append(False)
            else:
                # wrapped so that reference-shaped data stays literal on the server
                run_values.append({"value": value})
                literals.append(True)
        output = program.run(
            id="output",
            fn=function,
            args=[len(positional), list(keywords), literals, *run_values],
        )
        program.return_(key="output", value=output)
        return program

    def _pickle_program(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Program:
        try:
            payload = _dump_call(self.__wrapped__, args, kwargs)
        except Exception:
            culprit = _unpicklable_part(self.__wrapped__, self._bind(args, kwargs), args, kwargs)
            if culprit is None:
                raise
            label, exc = culprit
            raise TypeError(
                f"{self.__name__}(): {label} cannot be pickled: {type(exc).__name__}: {exc}"
            ) from exc
        program = Program()
        module = program.upload(id="module", kind="module", source=TRAMPOLINE_SOURCE)
        function = program.get_function(
            id="function", module=module, name=TRAMPOLINE_FUNCTION, cpu_only=self.cpu_only
        )
        argument = program.upload(id="payload", kind="bytes", value=payload)
        output = program.run(id="output", fn=function, args=[argument])
        program.return_(key="output", value=output)
        return program

    # -- calling ------------------------------------------------------------------------

    @overload
    def execute(
        self,
        *args: Any,
        run_async: Literal[False] = False,
        serialization: str | None = None,
        **kwargs: Any,
    ) -> ProgramResult: ...

    @overload
    def execute(
        self, *args: Any, run_async: Literal[True], serialization: str | None = None, **kwargs: Any
    ) -> Coroutine[Any, Any, ProgramResult]: ...

    @overload
    def execute(
        self, *args: Any, run_async: bool, serialization: str | None = None, **kwargs: Any
    ) -> ProgramResult | Coroutine[Any, Any, ProgramResult]: ...

    def execute(
        self, *args: Any, run_async: bool = False, serialization: str | None = None, **kwargs: Any
    ) -> ProgramResult | Coroutine[Any, Any, ProgramResult]:
        """Run remotely; the ``ProgramResult`` (a coroutine giving it with ``run_async``)."""
        if _asked_async(run_async):
            return self._execute_async(args, kwargs, serialization)
        fmt = self._format(serialization)
        return self._execute_blocking(self._build(args, kwargs, fmt), fmt)

    @overload
    def remote(
        self,
        *args: Any,
        run_async: Literal[False] = False,
        serialization: str | None = None,
        **kwargs: Any,
    ) -> Any: ...

    @overload
    def remote(
        self, *args: Any, run_async: Literal[True], serialization: str | None = None, **kwargs: Any
    ) -> Coroutine[Any, Any, Any]: ...

    @overload
    def remote(
        self, *args: Any, run_async: bool, serialization: str | None = None, **kwargs: Any
    ) -> Any: ...

    def remote(
        self, *args: Any, run_async: bool = False, serialization: str | None = None, **kwargs: Any
    ) -> Any:
        """Run remotely and return the value (a coroutine giving it with ``run_async``).

        ``FAILED`` → ``RemoteExecutionError`` carrying the result; HTTP and transport errors
        propagate.
        """
        if _asked_async(run_async):
            return self._remote_async(args, kwargs, serialization)
        fmt = self._format(serialization)
        result = self._execute_blocking(self._build(args, kwargs, fmt), fmt)
        try:
            return self._value(result, fmt)
        except RemoteExecutionError as error:  # one KCoral frame shown, not three
            raise error.with_traceback(None) from None

    def _value(self, result: ProgramResult, fmt: str) -> Any:
        show_output(result)  # the function's prints, as a local call shows them
        try:
            return output_value(result, fmt)
        except RemoteExecutionError as error:  # shown with the failing line of the user's code
            note_remote_traceback(error, self.__wrapped__, fmt)
            raise

    async def _remote_async(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], serialization: str | None
    ) -> Any:
        fmt = self._format(serialization)
        result = await self._execute_async(args, kwargs, serialization)
        return self._value(result, fmt)

    async def _execute_async(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], serialization: str | None
    ) -> ProgramResult:
        fmt = self._format(serialization)
        program = self._build(args, kwargs, fmt)
        try:
            if self._client.is_async:
                return await self._client.execute(program, **self._options(fmt))
            # A sync Client: its blocking call runs on a thread so the caller's loop keeps
            # running, and a cancel cuts its connection.
            call = functools.partial(self._client.execute, program, **self._options(fmt))
            return await call_cuttable(call)
        except KCoralError as error:
            raise deadline_said(error, self.__name__, self._client, self.timeout) from None

    def _execute_blocking(self, program: Program, fmt: str) -> ProgramResult:
        try:
            if self._client.is_async:
                return run_blocking(self._client.execute(program, **self._options(fmt)))
            return self._client.execute(program, **self._options(fmt))
        except KeyboardInterrupt:  # its connection closed: the server cancels the program
            raise interrupted(self.__name__, self._client) from None
        except KCoralError as error:
            raise deadline_said(error, self.__name__, self._client, self.timeout) from None

    def _options(self, fmt: str) -> dict[str, Any]:
        return {
            "timeout_seconds": self.timeout,
            "output_limit_bytes": self.output_limit_bytes,
            "serialization": fmt,
            # None in a session: the session's own selector
            "select": self.select or None,
        }


def output_value(result: ProgramResult, fmt: str) -> Any:
    """The decoded ``output`` of a remote-function result (CLIENT_API §8 ``remote``)."""
    if not result.completed:
        raise RemoteExecutionError(result)
    if "output" not in result.results:
        raise ProtocolError(f"remote function result {result.request_id} has no 'output' return")
    value = result.results["output"]
    if fmt == "json":
        # A JSON-mode call asked for no pickle: its output is data as decoded (bytes stay
        # bytes, even bytes that look like a pickle envelope; a function may return those).
        return value
    if not isinstance(value, bytes):
        raise ProtocolError(f"pickle-mode result {result.request_id} is not bytes")
    # Only ``output`` was asked for in pickle; other return keys are never looked at.
    what = f"the result of request {result.request_id}"
    return load_requested({"output": value}, {"output"}, what=what)["output"]


def refuse_bare_decorator(bare: object, owner: str) -> None:
    """``@client.function`` without its parentheses passes the function as ``bare``: refused
    naming the fix, where Python's "takes 1 positional argument but 2 were given" did not."""
    if bare is not None:
        raise TypeError(f"write @{owner}.function() with its parentheses (it takes only options)")


def remote_function_decorator(
    client: RemoteCaller, **options: Any
) -> Callable[[Callable[..., Any]], RemoteFunction]:
    """``@client.function(...)`` of both clients: a decorator binding ``RemoteFunction``
    to ``client`` with the decorator's options."""

    def decorate(fn: Callable[..., Any]) -> RemoteFunction:
        return RemoteFunction(fn, client=client, **options)

    return decorate
