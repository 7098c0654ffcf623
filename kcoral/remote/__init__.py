"""Remote functions: a decorated Python function run on the server (CLIENT_API.md §8).

Two formats (EXTENSIONS.md §4): ``json`` uploads the function's source (``source``), JSON
literals and whole binary arguments (checked in ``arguments``); ``pickle`` sends the function
and its arguments by value (``pickled``: cloudpickle, imported only then) in one ``bytes``
upload, which the server's trampoline (``kcoral_server.worker.trampoline``) runs, pickling
the result back. Pickle payloads carry an envelope naming the writer's Python and cloudpickle
versions (``kcoral.protocol.pickle_envelope``, whose names older ``%%kcoral`` code imports
from here); the client unpickles only what a call asked for in pickle (``load_requested``).
What a call shows its caller (prints, a failure's traceback) is ``report``'s.

This package hands on ``load_requested``, ``dump_by_value``, ``load_envelope`` and
``dump_envelope``: ``kcoral_jupyter`` and older ``%%kcoral`` code import them from here.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import types
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypeVar, overload

from kcoral.blocking import run_blocking
from kcoral.connection.in_flight import call_cuttable
from kcoral.errors import KCoralError, ProtocolError, RemoteExecutionError
from kcoral.program import Program
from kcoral.protocol.pickle_envelope import dump_envelope as dump_envelope
from kcoral.protocol.pickle_envelope import load_envelope as load_envelope
from kcoral.protocol.selector import SelectorInput, check_select
from kcoral.remote.arguments import (
    PICKLE_SENDS_IT,
    argument_labels,
    check_call_options,
    check_json,
    check_serialization,
    is_binary,
)
from kcoral.remote.pickled import dump_by_value as dump_by_value
from kcoral.remote.pickled import dump_call, unpicklable_part
from kcoral.remote.pickled import load_requested as load_requested
from kcoral.remote.report import (
    call_error_said,
    ctrl_c_said,
    interrupted,
    note_remote_traceback,
    show_output,
    show_printed,
)
from kcoral.remote.source import dispatcher_name, json_module_source
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
        serialization = check_serialization(serialization, "serialization")
        self.select = check_select(select)  # sent with every call (EXTENSIONS §14)
        if not callable(fn):
            raise TypeError(f"a remote function must be callable, not {type(fn).__name__}")
        if serialization == "json" and not isinstance(fn, types.FunctionType):
            # a partial, a builtin, a method: JSON mode sends source, which they have none of
            raise TypeError(
                f"a JSON-mode remote function must be a Python function, not "
                f"{type(fn).__name__}{PICKLE_SENDS_IT}"
            )
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError("a generator function cannot be a remote function: return a list")
        if not isinstance(cpu_only, bool):
            raise TypeError(f"cpu_only must be a bool, not {type(cpu_only).__name__}")
        check_call_options(timeout, output_limit_bytes)
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
        return check_serialization(serialization, "serialization")

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
                raise TypeError(
                    f"JSON mode needs a Python function, not {type(fn).__name__}" + PICKLE_SENDS_IT
                )
            self._json_source = json_module_source(fn)
        return self._json_source

    def _json_program(self, bound: inspect.BoundArguments) -> Program:
        source = self._module_source()
        given = set(bound.arguments)
        bound.apply_defaults()  # defaults are bound here and sent explicitly (§8)
        positional = list(bound.args)
        keywords = dict(bound.kwargs)
        values = positional + list(keywords.values())
        labels = argument_labels(bound, given) + [f"argument {name!r}" for name in keywords]
        for value, label in zip(values, labels, strict=True):
            if not is_binary(value):
                try:
                    check_json(value, label, set())
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
            elif is_binary(value):
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
            payload = dump_call(self.__wrapped__, args, kwargs)
        except Exception:
            culprit = unpicklable_part(self.__wrapped__, self._bind(args, kwargs), args, kwargs)
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
        try:
            result = self._execute_blocking(self._build(args, kwargs, fmt), fmt)
        except KCoralError as error:
            show_printed(error)
            raise
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
        try:
            result = await self._execute_async(args, kwargs, serialization)
        except KCoralError as error:
            show_printed(error)
            raise
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
        except asyncio.CancelledError as cancel:  # its connection cut: the program is cancelled
            raise ctrl_c_said(cancel, self.__name__, self._client) from None
        except KCoralError as error:
            raise call_error_said(error, self.__name__, self._client, self.timeout) from None

    def _execute_blocking(self, program: Program, fmt: str) -> ProgramResult:
        try:
            if self._client.is_async:
                return run_blocking(self._client.execute(program, **self._options(fmt)))
            return self._client.execute(program, **self._options(fmt))
        except KeyboardInterrupt:  # its connection closed: the server cancels the program
            raise interrupted(self.__name__, self._client) from None
        except KCoralError as error:
            raise call_error_said(error, self.__name__, self._client, self.timeout) from None

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
